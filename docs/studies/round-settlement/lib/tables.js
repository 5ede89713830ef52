// Builds the markdown tables of REPORT.md from results/*.json.
const fs = require("fs");
const path = require("path");
const dir = path.join(__dirname, "..", "results");
const load = (hf, key) => { const f = path.join(dir, `${hf}-${key}.json`); return fs.existsSync(f) ? JSON.parse(fs.readFileSync(f)) : null; };
const NAMES = { A2: "A verified, 2 tx/round (openings only)", A2C: "A verified, 2 tx/round (brief: commitments re-sent)",
  A1: "A verified, pipelined 1 tx/round", A1R: "A verified, pipelined, fixed roster", B: "B optimistic, 1 tx/round" };
const k1 = (n) => (n / 1000).toFixed(1) + "k";
let out = "";
out += "| design | k | providers | R=2 | R=10 | R=50 | R=50 w/o provider withdrawals | round txs per round (mean, R=50 order) | per order | target |\n|---|---|---|---|---|---|---|---|---|---|\n";
for (const d of ["A2", "A2C", "A1", "A1R", "B"]) for (const k of [3, 1]) for (const dist of [0, 1]) {
  const r = load("prague", `${d}_${k}_${dist}`); if (!r) continue;
  const target = k === 3 ? 60000 : 25000;
  const cell = (x) => x ? `${x.perShardUnit.toLocaleString("en")}${x.perShardUnit <= target ? " ✓" : ""}` : "-";
  const byR = Object.fromEntries(r.results.map((x) => [x.rounds, x]));
  const x50 = byR[50];
  const wProv = x50.byName["withdraw(provider)"].gas;
  const noW = Math.round((x50.total - wProv) / x50.shardUnits);
  out += `| ${NAMES[d]} | ${k} | ${dist ? (k === 3 ? "24 distinct" : "8 distinct") : `${k} reused`} | ${cell(byR[2])} | ${cell(byR[10])} | ${cell(x50)} | ${noW.toLocaleString("en")}${noW <= target ? " ✓" : ""} | ${x50.perRound.toLocaleString("en")} | ${x50.perOrder.toLocaleString("en")} | ${target / 1000}k |\n`;
}
out += "\n\nPer-transaction means (prague, R=10 order):\n\n| design | k | providers | transactions (mean gas, [n floor-bound]) |\n|---|---|---|---|\n";
for (const d of ["A2", "A2C", "A1", "A1R", "B"]) for (const k of [3, 1]) for (const dist of [0, 1]) {
  const r = load("prague", `${d}_${k}_${dist}`); if (!r) continue;
  const x = r.results.find((y) => y.rounds === 10);
  out += `| ${d} | ${k} | ${dist ? "distinct" : "reused"} | ${Object.entries(x.byName).map(([n, e]) => `${n} ${e.count > 1 ? "x" + e.count + " " : ""}${e.mean.toLocaleString("en")}${e.floorBound ? ` [${e.floorBound} floor]` : ""}`).join("; ")} |\n`;
}
out += "\n\nCancun (no EIP-7623 calldata floor) vs Prague, R=10, gas per shard unit:\n\n| design | k | providers | prague | cancun | diff |\n|---|---|---|---|---|---|\n";
for (const d of ["A2", "A2C", "A1", "A1R", "B"]) for (const k of [3, 1]) for (const dist of [0, 1]) {
  const p = load("prague", `${d}_${k}_${dist}`), c = load("cancun", `${d}_${k}_${dist}`); if (!p || !c) continue;
  const pp = p.results.find((y) => y.rounds === 10).perShardUnit, cc = c.results.find((y) => y.rounds === 10).perShardUnit;
  out += `| ${d} | ${k} | ${dist ? "distinct" : "reused"} | ${pp.toLocaleString("en")} | ${cc.toLocaleString("en")} | ${(pp - cc).toLocaleString("en")} |\n`;
}
console.log(out);
