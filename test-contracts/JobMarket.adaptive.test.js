// JobMarket: adaptive replication (postAdaptiveOrder): fewer replicas only for providers with a streak.
"use strict";

const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("./chain");
const h = require("./helpers");

const { PARAMS, PRICE, FEE, ACCEPT, FAULT, FRAUD } = h;
const STREAK = 2;

async function postAdaptive(sys, opts = {}) {
  const deadline = BigInt(await time.latest()) + 30n * 24n * 3600n;
  const args = [ethers.id("spec"), opts.units ?? 4, opts.min ?? 1, opts.max ?? 3, opts.streak ?? STREAK, PRICE, FEE,
    deadline];
  const receipt = await (await sys.market.connect(sys.buyer).postAdaptiveOrder(...args)).wait();
  const posted = receipt.logs.map((l) => sys.market.interface.parseLog(l)).find((e) => e && e.name === "OrderPosted");
  return posted.args.orderId;
}

/** Runs one unit of `orderId` on `providers` to the end: unanimous results finalize (no draw), else the
 * given outcomes settle by verdict. */
async function settleUnit(sys, orderId, providers, outcomes = null) {
  const { unitId } = await h.assignUnit(sys, orderId, { providers });
  const digests = providers.map(() => h.digestOf("same"));
  await h.commitAll(sys, unitId, providers, digests);
  await h.revealAll(sys, unitId, providers, digests);
  if (outcomes === null) {
    await sys.market.connect(sys.operator).finalize(unitId);
  } else {
    const sigs = [];
    for (const v of sys.verifiers.slice(0, 2)) sigs.push(await h.signVerdict(sys.market, v, unitId, outcomes));
    await sys.market.connect(sys.other).submitVerdict(unitId, outcomes, sigs);
  }
  return unitId;
}

async function adaptiveFixture() {
  const sys = await h.systemFixture();
  return { sys, orderId: await postAdaptive(sys) };
}

describe("JobMarket: adaptive replication", function () {
  it("escrows the most replicas per unit and records its bounds; bad bounds are refused", async function () {
    const { sys, orderId } = await loadFixture(adaptiveFixture);
    const order = await sys.market.getOrder(orderId);
    expect([order.minReplicas, order.replicas, order.trustedStreak]).to.deep.equal([1n, 3n, BigInt(STREAK)]);
    expect(order.balance).to.equal(4n * (3n * PRICE + FEE));
    await expect(postAdaptive(sys, { min: 0 })).to.be.revertedWithCustomError(sys.market, "InvalidReplicaBounds")
      .withArgs(0, 3);
    await expect(postAdaptive(sys, { min: 3, max: 2 })).to.be.revertedWithCustomError(sys.market,
      "InvalidReplicaBounds").withArgs(3, 2);
    await expect(postAdaptive(sys, { max: 6 })).to.be.revertedWithCustomError(sys.market, "InvalidReplicaCount")
      .withArgs(6);
    const fixed = await sys.market.getOrder((await h.postOrder(sys, { replicas: 2 })).orderId);
    expect([fixed.minReplicas, fixed.replicas, fixed.trustedStreak]).to.deep.equal([2n, 2n, 0n]);
  });

  it("gives a newcomer only a unit of the most replicas", async function () {
    const { sys, orderId } = await loadFixture(adaptiveFixture);
    const [a] = sys.providers;
    const balance = (await sys.market.getOrder(orderId)).balance;
    await expect(h.assignUnit(sys, orderId, { providers: [a] })).to.be.revertedWithCustomError(sys.market,
      "ProviderNotTrusted").withArgs(a.address, STREAK);
    expect((await sys.market.getOrder(orderId)).balance).to.equal(balance);
    await h.assignUnit(sys, orderId, { providers: sys.providers.slice(0, 3) });
  });

  it("assigns a provider past its streak alone, charging one replica, and refunds the rest at close",
    async function () {
    const { sys, orderId } = await loadFixture(adaptiveFixture);
    const three = sys.providers.slice(0, 3);
    for (let i = 0; i < STREAK; i++) await settleUnit(sys, orderId, three);
    expect((await sys.market.reputationOf(three[0].address)).consecutiveValid).to.equal(BigInt(STREAK));
    const before = (await sys.market.getOrder(orderId)).balance;
    const { unitId } = await h.assignUnit(sys, orderId, { providers: [three[0]] });
    expect((await sys.market.getOrder(orderId)).balance).to.equal(before - PRICE - FEE);
    expect((await sys.market.getUnit(unitId)).replicas).to.equal(1n);
    await h.commitAll(sys, unitId, [three[0]], [h.digestOf("same")]);
    await h.revealAll(sys, unitId, [three[0]], [h.digestOf("same")]);
    await sys.market.connect(sys.operator).finalize(unitId);
    const order = await sys.market.getOrder(orderId);
    expect(order.delivered).to.equal(3n);
    // Delivered units cost 2 x (3 PRICE + FEE) + PRICE (finalize returned every fee): one unit is left.
    expect(order.balance).to.equal(4n * (3n * PRICE + FEE) - 7n * PRICE);
    await expect(sys.market.connect(sys.buyer).closeOrder(orderId)).to.emit(sys.market, "OrderClosed")
      .withArgs(orderId, order.balance);
  });

  it("needs every provider of a reduced unit trusted, and a fault sends a provider back to full units",
    async function () {
    const { sys, orderId } = await loadFixture(adaptiveFixture);
    const [a, b, c] = sys.providers;
    for (let i = 0; i < STREAK; i++) await settleUnit(sys, orderId, [a, b, c]);
    const [d] = sys.providers.slice(3);
    await expect(h.assignUnit(sys, orderId, { providers: [a, d] })).to.be.revertedWithCustomError(sys.market,
      "ProviderNotTrusted").withArgs(d.address, STREAK);
    await settleUnit(sys, orderId, [a, b, c], [FAULT, ACCEPT, ACCEPT]);
    expect((await sys.market.reputationOf(a.address)).consecutiveValid).to.equal(0n);
    await expect(h.assignUnit(sys, orderId, { providers: [a] })).to.be.revertedWithCustomError(sys.market,
      "ProviderNotTrusted").withArgs(a.address, STREAK);
    await h.assignUnit(sys, orderId, { providers: [b, c] });
  });

  it("a fraud verdict ends the accused provider's streak at once, while its fraud is still held (not yet settled)",
    async function () {
    const { sys, orderId } = await loadFixture(adaptiveFixture);
    const [a, b, c] = sys.providers;
    for (let i = 0; i < STREAK; i++) await settleUnit(sys, orderId, [a, b, c]);
    expect((await sys.market.reputationOf(a.address)).consecutiveValid).to.equal(BigInt(STREAK));
    const unitId = await settleUnit(sys, orderId, [a, b, c], [FRAUD, ACCEPT, ACCEPT]);
    expect((await sys.market.heldOf(unitId))[0]).to.equal(1n); // held: no slash yet, the accusation counted
    expect(await sys.market.reputationOf(a.address)).to.deep.equal([BigInt(STREAK), 0n, 1n, 0n]);
    expect((await sys.stakes.stakeOf(a.address))[1]).to.equal(PARAMS.providerCollateral);
    await expect(h.assignUnit(sys, orderId, { providers: [a] })).to.be.revertedWithCustomError(sys.market,
      "ProviderNotTrusted").withArgs(a.address, STREAK);
    await h.assignUnit(sys, orderId, { providers: [b] }); // the accepted replicas' streaks go on
  });

  it("refuses a unit outside the bounds, or accepts that do not match its providers", async function () {
    const { sys } = await loadFixture(adaptiveFixture);
    const orderId = await postAdaptive(sys, { min: 2, max: 3, streak: 0 });
    await expect(h.assignUnit(sys, orderId, { providers: sys.providers.slice(0, 1) }))
      .to.be.revertedWithCustomError(sys.market, "ProviderCountMismatch").withArgs(3, 1);
    await expect(h.assignUnit(sys, orderId, { providers: sys.providers.slice(0, 4) }))
      .to.be.revertedWithCustomError(sys.market, "ProviderCountMismatch").withArgs(3, 4);
    const two = sys.providers.slice(0, 2);
    const key = ethers.id("unit:mismatch");
    const accepts = [await h.signAccept(sys.market, two[0], orderId, key)];
    await expect(sys.market.connect(sys.operator).assign(orderId, key, two.map((p) => p.address),
      sys.verifiers.map((v) => v.address), accepts)).to.be.revertedWithCustomError(sys.market,
      "ProviderCountMismatch").withArgs(2, 1);
    await h.assignUnit(sys, orderId, { providers: two }); // streak 0: anyone on a reduced unit
  });

  it("audits a unit of one replica by the solo spot-check draw", async function () {
    const sys = await h.fundedSystem({ ...PARAMS, soloSpotCheckPpm: 1_000_000 });
    const orderId = await postAdaptive(sys, { streak: 0 });
    const [a] = sys.providers;
    const { unitId } = await h.assignUnit(sys, orderId, { providers: [a] });
    await h.commitAll(sys, unitId, [a], [h.digestOf("same")]);
    await expect(sys.market.connect(sys.other).reveal(unitId, a.address, h.digestOf("same"), h.saltOf(`${unitId}:0`)))
      .to.emit(sys.market, "VerificationRequested").withArgs(unitId);
    await expect(sys.market.connect(sys.operator).finalize(unitId)).to.be.revertedWithCustomError(sys.market, "UnitUnderVerification");
    const sigs = [];
    for (const v of sys.verifiers.slice(0, 2)) sigs.push(await h.signVerdict(sys.market, v, unitId, [ACCEPT]));
    await sys.market.connect(sys.other).submitVerdict(unitId, [ACCEPT], sigs);
    expect((await sys.market.reputationOf(a.address)).valid).to.equal(1n);
  });
});
