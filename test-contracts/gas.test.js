// Gas of every transaction one 3-replica unit costs, printed per action (receipt.gasUsed).
"use strict";

const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture } = require("./chain");
const h = require("./helpers");

async function relayedCommit(sys, unitId, provider, digest, salt) {
  const commitment = h.commitmentOf(digest, salt, provider.address, unitId);
  const nonce = await sys.market.nonces(provider.address);
  const deadline = await h.farDeadline();
  const sig = await h.signMarket(provider, sys.market, "Commit",
    { unitId, provider: provider.address, commitment, nonce, deadline });
  return sys.market.connect(sys.operator).commitWithSig(unitId, provider.address, commitment, nonce, deadline, sig);
}

/** Runs one unit through the fast path; returns gas per action. */
async function measureUnit(sys, label) {
  const gas = {};
  const add = async (name, txPromise) => {
    const receipt = await (await txPromise).wait();
    gas[name] = (gas[name] ?? 0n) + receipt.gasUsed;
    return receipt;
  };
  const deadline = BigInt((await ethers.provider.getBlock("latest")).timestamp) + 86400n;
  const postReceipt = await add("postOrder", sys.market.connect(sys.buyer)
    .postOrder(ethers.id(label), 1, 3, h.PRICE, h.FEE, deadline));
  const orderId = sys.market.interface.parseLog(postReceipt.logs.find((l) => l.address === sys.market.target))
    .args.orderId;
  const providers = sys.providers.slice(0, 3);
  const unitKey = ethers.id(label);
  const accepts = [];
  for (const p of providers) accepts.push(await h.signAccept(sys.market, p, orderId, unitKey));
  const assignReceipt = await add("assign", sys.market.connect(sys.operator).assign(
    orderId, unitKey, providers.map((p) => p.address), sys.verifiers.slice(0, 2).map((v) => v.address), accepts));
  const unitId = sys.market.interface.parseLog(
    assignReceipt.logs.find((l) => l.address === sys.market.target && sys.market.interface.parseLog(l)?.name === "UnitAssigned"),
  ).args.unitId;
  const digest = h.digestOf(label);
  for (let i = 0; i < 3; i++) {
    await add(`commitWithSig#${i + 1}`, relayedCommit(sys, unitId, providers[i], digest, h.saltOf(`${label}${i}`)));
  }
  for (let i = 0; i < 3; i++) {
    await add(`reveal#${i + 1}`, sys.market.connect(sys.operator)
      .reveal(unitId, providers[i].address, digest, h.saltOf(`${label}${i}`)));
  }
  await add("finalize", sys.market.connect(sys.operator).finalize(unitId));
  for (let i = 0; i < 3; i++) {
    await add(`withdrawCredit#${i + 1}`, sys.market.connect(providers[i]).withdrawCredit());
  }
  const perUnit = Object.values(gas).reduce((a, b) => a + b, 0n);
  const closeGas = (await (await sys.market.connect(sys.buyer).closeOrder(orderId)).wait()).gasUsed;
  const buyerWithdrawGas = (await (await sys.market.connect(sys.buyer).withdrawCredit()).wait()).gasUsed;
  return { gas, perUnit, closeGas, buyerWithdrawGas };
}

function print(title, { gas, perUnit, closeGas, buyerWithdrawGas }) {
  const lines = Object.entries(gas).map(([k, v]) => `    ${k.padEnd(20)} ${v.toString().padStart(9)}`);
  console.log(`  ${title}\n${lines.join("\n")}\n    ${"TOTAL per unit".padEnd(20)} ${perUnit.toString().padStart(9)}` +
    `\n    (per order, not counted: closeOrder ${closeGas}, buyer withdrawCredit ${buyerWithdrawGas})`);
}

describe("Gas of one 3-replica unit (fast path, relayed commits, 2 verifiers assigned)", function () {
  it("prints gas per action for a first unit on fresh accounts and for a steady-state unit", async function () {
    const sys = await loadFixture(h.systemFixture);
    // A long-lived background order keeps the market's escrow total and token balance non-zero, as on a
    // live market; otherwise every measured order would pay for re-creating those two slots.
    await h.postOrder(sys, { units: 1 });
    const first = await measureUnit(sys, "first");
    const steady = await measureUnit(sys, "steady");
    print("first unit (fresh accounts: nonce, credit and reputation slots created)", first);
    print("steady state (second unit, same parties)", steady);
    // Regression guard: measured 953,761 (steady state, Nov 2026); a change that adds 2 % fails here.
    expect(steady.perUnit).to.be.lessThan(first.perUnit);
    expect(steady.perUnit).to.be.lessThan(975_000n);
  });
});
