const fs = require("fs");
const path = require("path");
const { expect } = require("chai");
const { study, fmt, FAR, SHARDS, fresh, PRICE, TOKEN } = require("../lib/scenario");
const { ethers, network } = require("hardhat");

const RS = (process.env.RS || "2,10,50").split(",").map(Number);
const ONLY = process.env.ONLY;

function save(name, res) {
  delete res.ctx;
  fs.writeFileSync(path.join(__dirname, "..", "results", `${network.config.hardfork}-${name}.json`), JSON.stringify(res, null, 1));
}

describe("Design B: optimistic round", function () {
  for (const k of [3, 1]) for (const distinct of [false, true]) {
    const key = `B:${k}:${distinct ? 1 : 0}`;
    if (ONLY && !ONLY.split(",").includes(key)) continue;
    it(key, async function () {
      const res = await study("B", k, distinct, RS);
      console.log(fmt(res));
      save(key.replaceAll(":", "_"), res);
    });
  }

  if (!ONLY || ONLY.includes("nostake")) {
    it("B k=3 distinct without stake check", async function () {
      const res = await study("B", 3, true, [10], { checkStake: false });
      console.log(fmt(res));
      save("B_3_1_nostake", res);
    });
  }

  if (!ONLY || ONLY.includes("challenge")) {
    it("challengeSignature: a bad signature voids the round and slashes the bond", async function () {
      const res = await study("B", 3, false, [2]);
      const ctx = res.ctx;
      const m = ctx.market;
      const [, , , challenger] = await ethers.getSigners();
      const orderId = Number(await m.orderCount()) + 1;
      await m.connect(ctx.buyer).postOrder(fresh(), 2, SHARDS, 3, PRICE, 3n * TOKEN, FAR);
      ctx.badLeaf = { round: 0, leaf: 5 };
      const r0 = ctx.buildRound(orderId, 0);
      await m.postRound(orderId, 0, [], [], ethers.ZeroHash, FAR, r0.providers, ctx.leaves(r0), r0.sigs);
      const idx0 = (Number((await m.totals()).roundCount) - 1) % 64;
      ctx.badLeaf = { round: 1, leaf: 7 };
      const r1 = ctx.buildRound(orderId, 1);
      await m.postRound(orderId, 1, r0.providers, ctx.openings(r0), r0.aux, FAR, r1.providers, ctx.leaves(r1), r1.sigs);
      const idx1 = (idx0 + 1) % 64;
      // a valid leaf cannot be challenged
      await expect(m.connect(challenger).challengeSignature(idx0, 4, FAR, r0.providers, ctx.leaves(r0), r0.sigs))
        .to.be.revertedWithCustomError(m, "SignatureValid");
      const p0 = ctx.providers[0].address;
      const pendingBefore = await m.pendingOf(p0);
      const bondBefore = await m.operatorBond();
      // round 0: already revealed and paid into pending buckets: the void takes the pay back
      const tx0 = await m.connect(challenger).challengeSignature(idx0, 5, FAR, r0.providers, ctx.leaves(r0), r0.sigs);
      const g0 = Number((await tx0.wait()).gasUsed);
      // round 1: posted, not revealed: the void only marks it
      const tx1 = await m.connect(challenger).challengeSignature(idx1, 7, FAR, r1.providers, ctx.leaves(r1), r1.sigs);
      const g1 = Number((await tx1.wait()).gasUsed);
      const pendingAfter = await m.pendingOf(p0);
      expect(pendingBefore.amountA + pendingBefore.amountB - pendingAfter.amountA - pendingAfter.amountB).to.equal(9n * PRICE);
      expect(bondBefore - (await m.operatorBond())).to.equal(100n * TOKEN);
      await m.revealLast(orderId, 1, r1.providers, ctx.openings(r1), r1.aux); // pays nothing: voided
      const o = await m.orderOf(orderId);
      expect(o[1].balance).to.equal(2n * 9n * (3n * PRICE + 3n * TOKEN)); // all escrow back with the order
      const out = { challengeRevealedRound: g0, challengePostedRound: g1, calldataBytes: ethers.getBytes(tx0.data).length };
      console.log("challengeSignature gas:", out);
      fs.writeFileSync(path.join(__dirname, "..", "results", `${network.config.hardfork}-B_challenge.json`), JSON.stringify(out));
    });
  }
});
