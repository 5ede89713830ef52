const fs = require("fs");
const path = require("path");
const { study, fmt } = require("../lib/scenario");
const { network } = require("hardhat");

const RS = (process.env.RS || "2,10,50").split(",").map(Number);
const ONLY = process.env.ONLY; // e.g. "A2:3:0"

describe("Design A: verified round", function () {
  const cases = [];
  for (const design of (process.env.DESIGNS || "A2,A2C,A1,A1R").split(",")) for (const k of [3, 1]) for (const distinct of [false, true]) cases.push([design, k, distinct]);
  for (const [design, k, distinct] of cases) {
    const key = `${design}:${k}:${distinct ? 1 : 0}`;
    if (ONLY && !ONLY.split(",").includes(key)) continue;
    it(key, async function () {
      const res = await study(design, k, distinct, RS);
      console.log(fmt(res));
      delete res.ctx;
      fs.writeFileSync(path.join(__dirname, "..", "results", `${network.config.hardfork}-${key.replaceAll(":", "_")}.json`),
        JSON.stringify(res, null, 1));
    });
  }
  if (!ONLY || ONLY.includes("nostake")) {
    it("A2 k=3 distinct without stake check (stake-check cost)", async function () {
      const res = await study("A2", 3, true, [10], { checkStake: false });
      console.log(fmt(res));
      delete res.ctx;
      fs.writeFileSync(path.join(__dirname, "..", "results", `${network.config.hardfork}-A2_3_1_nostake.json`), JSON.stringify(res, null, 1));
    });
  }
});
