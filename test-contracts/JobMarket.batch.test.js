// JobMarket batch entry points (commitBatch, revealBatch), recycled commitment pages, the party
// registry, and StakeManager's lockBatch/unlockBatch.
"use strict";

const { expect } = require("chai");
const { ethers, network } = require("hardhat");
const { loadFixture, time } = require("./chain");
const h = require("./helpers");

const { PRICE, FEE, UNIT_STATE, ACCEPT, FAULT } = h;

/** Signed commits of `digests[i]` by each provider (salt per unit and replica, as h.commitAll). */
async function signedCommits(sys, unitId, providers, digests, opts = {}) {
  const commits = [];
  for (let i = 0; i < providers.length; i++) {
    const c = h.commitmentOf(digests[i], h.saltOf(`${unitId}:${i}`), providers[i].address, unitId);
    commits.push(await h.signUnitCommit(sys.market, providers[i], unitId, c, opts));
  }
  return commits;
}

function revealsOf(unitId, providers, digests, indices = providers.map((_, i) => i)) {
  return indices.map((i) => ({ provider: providers[i].address, resultDigest: digests[i], salt: h.saltOf(`${unitId}:${i}`) }));
}

/** The storage slot (among the first 40) of a private JobMarket variable holding exactly `value`. */
async function slotHolding(market, value) {
  const matches = [];
  for (let slot = 0; slot < 40; slot++) {
    const word = await network.provider.send("eth_getStorageAt", [market.target, ethers.toBeHex(slot), "latest"]);
    if (BigInt(word) === value) matches.push(slot);
  }
  expect(matches, `slots holding ${value}`).to.have.length(1);
  return matches[0];
}

async function setSlot(market, slot, value) {
  await network.provider.send("hardhat_setStorageAt", [market.target, ethers.toBeHex(slot), ethers.toBeHex(value, 32)]);
}

describe("JobMarket: commitBatch", function () {
  it("records every signed commitment in one transaction, opens the reveal phase, consumes no nonce", async function () {
    const { sys, unitId, providers } = await loadFixture(h.assignedFixture);
    const digests = providers.map(() => h.digestOf("same"));
    const commits = await signedCommits(sys, unitId, providers, digests);
    const noncesBefore = await Promise.all(providers.map((p) => sys.market.nonces(p.address)));
    const tx = sys.market.connect(sys.other).commitBatch(unitId, commits);
    for (const c of commits) {
      await expect(tx).to.emit(sys.market, "ReplicaCommitted").withArgs(unitId, c.provider, c.commitment);
    }
    const u = await sys.market.getUnit(unitId);
    expect([u.state, u.committedMask]).to.deep.equal([UNIT_STATE.Revealing, 7n]);
    for (let i = 0; i < 3; i++) {
      expect(await sys.market.replicaOf(unitId, i)).to.deep.equal([providers[i].address, commits[i].commitment, true, false]);
    }
    expect(await Promise.all(providers.map((p) => sys.market.nonces(p.address)))).to.deep.equal(noncesBefore);
  });

  it("takes a subset in any order; the rest may commit later by another path", async function () {
    const { sys, unitId, providers } = await loadFixture(h.assignedFixture);
    const commits = await signedCommits(sys, unitId, providers, providers.map(() => h.digestOf("same")));
    await sys.market.commitBatch(unitId, [commits[2], commits[0]]);
    expect((await sys.market.getUnit(unitId)).committedMask).to.equal(5n);
    await sys.market.connect(providers[1]).commit(unitId, commits[1].commitment);
    expect((await sys.market.getUnit(unitId)).state).to.equal(UNIT_STATE.Revealing);
  });

  it("rejects an empty batch, a wrong signer, another chain, a Commit-typed signature and an expired one", async function () {
    const { sys, unitId, providers } = await loadFixture(h.assignedFixture);
    const p = providers[0];
    const c = h.commitmentOf(h.digestOf("r"), h.saltOf("s"), p.address, unitId);
    await expect(sys.market.commitBatch(unitId, [])).to.be.revertedWithCustomError(sys.market, "EmptyBatch");
    const forged = await h.signUnitCommit(sys.market, p, unitId, c, { signer: sys.other });
    await expect(sys.market.commitBatch(unitId, [forged]))
      .to.be.revertedWithCustomError(sys.market, "InvalidSigner").withArgs(p.address, sys.other.address);
    const otherChain = await h.signUnitCommit(sys.market, p, unitId, c, { chainIdDelta: 1n });
    await expect(sys.market.commitBatch(unitId, [otherChain])).to.be.revertedWithCustomError(sys.market, "InvalidSigner");
    // A signature of the nonce-carrying `Commit` type (for commitWithSig) is no `UnitCommit` signature.
    const deadline = await h.farDeadline();
    const commitTyped = await h.signMarket(p, sys.market, "Commit",
      { unitId, provider: p.address, commitment: c, nonce: await sys.market.nonces(p.address), deadline });
    await expect(sys.market.commitBatch(unitId, [{ provider: p.address, commitment: c, deadline, signature: commitTyped }]))
      .to.be.revertedWithCustomError(sys.market, "InvalidSigner");
    const soon = (await time.latest()) + 5n;
    const expiring = await h.signUnitCommit(sys.market, p, unitId, c, { deadline: soon });
    await time.setNextBlockTimestamp(soon + 1n);
    await expect(sys.market.commitBatch(unitId, [expiring]))
      .to.be.revertedWithCustomError(sys.market, "SignatureExpired").withArgs(soon, soon + 1n);
  });

  it("rejects non-providers, duplicates, replays, unknown units and commits after the deadline", async function () {
    const { sys, unitId, providers } = await loadFixture(h.assignedFixture);
    const verifier = sys.verifiers[0];
    const byVerifier = await h.signUnitCommit(sys.market, verifier, unitId, ethers.id("c"));
    await expect(sys.market.commitBatch(unitId, [byVerifier]))
      .to.be.revertedWithCustomError(sys.market, "NotAssignedProvider").withArgs(unitId, verifier.address);
    const good = await h.signUnitCommit(sys.market, providers[0], unitId, ethers.id("c"));
    await expect(sys.market.commitBatch(unitId, [good, good]))
      .to.be.revertedWithCustomError(sys.market, "AlreadyCommitted").withArgs(unitId, providers[0].address);
    await sys.market.commitBatch(unitId, [good]);
    await expect(sys.market.commitBatch(unitId, [good]))
      .to.be.revertedWithCustomError(sys.market, "AlreadyCommitted").withArgs(unitId, providers[0].address);
    const elsewhere = await h.signUnitCommit(sys.market, providers[1], 99n, ethers.id("c"));
    await expect(sys.market.commitBatch(99n, [elsewhere]))
      .to.be.revertedWithCustomError(sys.market, "InvalidUnitState").withArgs(99n, 0);
    const late = await h.signUnitCommit(sys.market, providers[1], unitId, ethers.id("d"));
    const { commitDeadline } = await sys.market.getUnit(unitId);
    await time.setNextBlockTimestamp(commitDeadline + 1n);
    await expect(sys.market.commitBatch(unitId, [late]))
      .to.be.revertedWithCustomError(sys.market, "CommitWindowClosed").withArgs(unitId, commitDeadline);
  });
});

describe("JobMarket: revealBatch", function () {
  it("sent by anyone but the operator, completes a unanimous unit's reveals without finalizing it", async function () {
    // A provider revealing straight on chain must not settle before the operator checked its digest
    // against a canary's known answer; the operator's finalize (or requestVerification) follows.
    const { sys, unitId, providers, digests } = await loadFixture(h.committedFixture);
    const reveals = revealsOf(unitId, providers, digests);
    expect(await sys.market.connect(providers[0]).revealBatch.staticCall(unitId, reveals)).to.equal(false);
    const tx = sys.market.connect(providers[0]).revealBatch(unitId, reveals);
    await expect(tx).to.not.emit(sys.market, "UnitFinalized");
    const u = await sys.market.getUnit(unitId);
    expect([u.state, u.revealedMask]).to.deep.equal([UNIT_STATE.Revealing, 7n]);
    await expect(sys.market.connect(providers[0]).finalize(unitId))
      .to.be.revertedWithCustomError(sys.market, "FinalizeReserved").withArgs(unitId, u.verdictDeadline);
    await expect(sys.market.connect(sys.operator).finalize(unitId))
      .to.emit(sys.market, "UnitFinalized").withArgs(unitId, digests[0]);
    await h.expectSolvent(sys);
  });

  it("reveals all replicas and finalizes a unanimous unit in the same transaction", async function () {
    const { sys, unitId, providers, digests, orderId } = await loadFixture(h.committedFixture);
    const reveals = revealsOf(unitId, providers, digests);
    expect(await sys.market.connect(sys.operator).revealBatch.staticCall(unitId, reveals)).to.equal(true);
    const orderBefore = await sys.market.getOrder(orderId);
    const tx = sys.market.connect(sys.operator).revealBatch(unitId, reveals);
    await expect(tx).to.emit(sys.market, "UnitFinalized").withArgs(unitId, digests[0]);
    for (const p of providers) await expect(tx).to.emit(sys.market, "ReplicaRevealed").withArgs(unitId, p.address, digests[0]);
    const u = await sys.market.getUnit(unitId);
    expect([u.state, u.revealedMask]).to.deep.equal([UNIT_STATE.Finalized, 7n]);
    for (let i = 0; i < 3; i++) {
      expect(await sys.market.replicaOf(unitId, i)).to.deep.equal([providers[i].address, digests[0], true, true]);
      expect(await sys.market.credits(providers[i].address)).to.equal(PRICE);
      expect(await sys.stakes.freeStake(providers[i].address)).to.equal(200n * h.E18);
      expect(await sys.market.reputationOf(providers[i].address)).to.deep.equal([1n, 0n, 0n, 1n]);
    }
    const order = await sys.market.getOrder(orderId);
    expect([order.delivered, order.openUnits, order.balance]).to.deep.equal([1n, 0n, orderBefore.balance + FEE]);
    await expect(sys.market.connect(sys.operator).finalize(unitId)).to.be.revertedWithCustomError(sys.market, "UnitAlreadySettled");
    await h.expectSolvent(sys);
  });

  it("completes reveals started one by one, and finalizes only once the last one comes in", async function () {
    const { sys, unitId, providers, digests } = await loadFixture(h.committedFixture);
    await sys.market.reveal(unitId, providers[1].address, digests[1], h.saltOf(`${unitId}:1`));
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, revealsOf(unitId, providers, digests, [2])))
      .to.not.emit(sys.market, "UnitFinalized");
    expect((await sys.market.getUnit(unitId)).revealedMask).to.equal(6n);
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, revealsOf(unitId, providers, digests, [0])))
      .to.emit(sys.market, "UnitFinalized").withArgs(unitId, digests[0]);
  });

  it("leaves differing digests for a verdict, which keeps every replica's digest readable", async function () {
    const digests = [h.digestOf("good"), h.digestOf("good"), h.digestOf("bad")];
    const sys = await loadFixture(h.systemFixture);
    const { unitId, providers } = await h.unitAt(sys, "committed", digests);
    const tx = sys.market.connect(sys.operator).revealBatch(unitId, revealsOf(unitId, providers, digests));
    await expect(tx).to.not.emit(sys.market, "UnitFinalized");
    expect((await sys.market.getUnit(unitId)).state).to.equal(UNIT_STATE.Revealing);
    await expect(sys.market.connect(sys.operator).finalize(unitId)).to.be.revertedWithCustomError(sys.market, "NotUnanimous");
    const outcomes = [ACCEPT, ACCEPT, FAULT];
    const sigs = [];
    for (const v of sys.verifiers.slice(0, 2)) sigs.push(await h.signVerdict(sys.market, v, unitId, outcomes));
    await sys.market.submitVerdict(unitId, outcomes, sigs);
    for (let i = 0; i < 3; i++) {
      expect(await sys.market.replicaOf(unitId, i)).to.deep.equal([providers[i].address, digests[i], true, true]);
    }
    await h.expectSolvent(sys);
  });

  it("does not finalize a unit drawn for verification", async function () {
    const { sys, unitId, providers, digests } = await loadFixture(h.committedFixture);
    await sys.market.connect(sys.operator).requestVerification(unitId);
    expect(await sys.market.revealBatch.staticCall(unitId, revealsOf(unitId, providers, digests))).to.equal(false);
    await sys.market.connect(sys.operator).revealBatch(unitId, revealsOf(unitId, providers, digests));
    const u = await sys.market.getUnit(unitId);
    expect([u.state, u.revealedMask]).to.deep.equal([UNIT_STATE.Revealing, 7n]);
  });

  it("rejects an empty batch, mismatches, non-providers, duplicates and replicas that never committed", async function () {
    const sys = await loadFixture(h.systemFixture);
    const { unitId, providers } = await h.unitAt(sys, "assigned");
    const digests = providers.map(() => h.digestOf("same"));
    await h.commitAll(sys, unitId, providers.slice(0, 2), digests);
    const { commitDeadline } = await sys.market.getUnit(unitId);
    const [r0, r1, r2] = revealsOf(unitId, providers, digests);
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, [r0])).to.be.revertedWithCustomError(sys.market, "RevealWindowNotOpen")
      .withArgs(unitId, commitDeadline);
    await time.increaseTo(commitDeadline + 1n);
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, [])).to.be.revertedWithCustomError(sys.market, "EmptyBatch");
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, [{ ...r0, salt: h.saltOf("wrong") }]))
      .to.be.revertedWithCustomError(sys.market, "RevealMismatch").withArgs(unitId, providers[0].address);
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, [{ ...r1, provider: providers[0].address }]))
      .to.be.revertedWithCustomError(sys.market, "RevealMismatch").withArgs(unitId, providers[0].address);
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, [{ ...r0, provider: sys.other.address }]))
      .to.be.revertedWithCustomError(sys.market, "NotAssignedProvider").withArgs(unitId, sys.other.address);
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, [r0, r0]))
      .to.be.revertedWithCustomError(sys.market, "AlreadyRevealed").withArgs(unitId, providers[0].address);
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, [r2]))
      .to.be.revertedWithCustomError(sys.market, "NotCommitted").withArgs(unitId, providers[2].address);
    await sys.market.connect(sys.operator).revealBatch(unitId, [r0]);
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, [r1, r0]))
      .to.be.revertedWithCustomError(sys.market, "AlreadyRevealed").withArgs(unitId, providers[0].address);
  });

  it("closes at the reveal deadline: T allowed, T+1 refused", async function () {
    const { sys, unitId, providers, digests } = await loadFixture(h.committedFixture);
    const { revealDeadline } = await sys.market.getUnit(unitId);
    await time.setNextBlockTimestamp(revealDeadline);
    await sys.market.connect(sys.operator).revealBatch(unitId, revealsOf(unitId, providers, digests, [0]));
    await time.setNextBlockTimestamp(revealDeadline + 1n);
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, revealsOf(unitId, providers, digests, [1])))
      .to.be.revertedWithCustomError(sys.market, "RevealWindowClosed").withArgs(unitId, revealDeadline);
  });
});

describe("JobMarket: multicall", function () {
  it("relays commitBatch and revealBatch in one transaction, keeps the caller's role, and reverts as a whole", async function () {
    const { sys, unitId, providers, orderId } = await loadFixture(h.assignedFixture);
    const digests = providers.map(() => h.digestOf("same"));
    const commits = await signedCommits(sys, unitId, providers, digests);
    const market = sys.market;
    // Reveals never share the last commit's block (its hash draws the spot check): the whole call reverts.
    await expect(market.multicall([
      market.interface.encodeFunctionData("commitBatch", [unitId, commits]),
      market.interface.encodeFunctionData("revealBatch", [unitId, revealsOf(unitId, providers, digests)]),
    ])).to.be.revertedWithCustomError(market, "RevealTooEarly");
    expect((await market.getUnit(unitId)).committedMask).to.equal(0n);
    await market.multicall([market.interface.encodeFunctionData("commitBatch", [unitId, commits])]);
    const bad = { ...revealsOf(unitId, providers, digests)[0], salt: h.saltOf("wrong") };
    await expect(market.multicall([
      market.interface.encodeFunctionData("revealBatch", [unitId, revealsOf(unitId, providers, digests, [1])]),
      market.interface.encodeFunctionData("revealBatch", [unitId, [bad]]),
    ])).to.be.revertedWithCustomError(market, "RevealMismatch");
    expect((await market.getUnit(unitId)).revealedMask).to.equal(0n);
    await expect(market.connect(sys.operator).multicall([
      market.interface.encodeFunctionData("revealBatch", [unitId, revealsOf(unitId, providers, digests)]),
    ])).to.emit(market, "UnitFinalized").withArgs(unitId, digests[0]); // the operator's relay finalizes
    const accepts = [];
    const unitKey = ethers.id("via-multicall");
    for (const p of providers) accepts.push(await h.signAccept(market, p, orderId, unitKey));
    const assignCall = market.interface.encodeFunctionData("assign",
      [orderId, unitKey, providers.map((p) => p.address), sys.verifiers.map((v) => v.address), accepts]);
    await expect(market.connect(sys.other).multicall([assignCall]))
      .to.be.revertedWithCustomError(market, "AccessControlUnauthorizedAccount");
    await expect(market.connect(sys.operator).multicall([assignCall])).to.emit(market, "UnitAssigned");
  });
});

describe("JobMarket: recycled commitment pages", function () {
  it("a recycled page never leaks into another unit's replicas, before or after settlement", async function () {
    const sys = await loadFixture(h.systemFixture);
    const same = [h.digestOf("a"), h.digestOf("a"), h.digestOf("a")];
    const first = await h.unitAt(sys, "revealed", same); // page released by finalize
    await sys.market.connect(sys.operator).finalize(first.unitId);
    // Second unit takes the same page; it expires with one replica committed and none revealed.
    const second = await h.unitAt(sys, "assigned");
    await h.commitAll(sys, second.unitId, second.providers.slice(0, 2), [h.digestOf("b"), h.digestOf("b")]);
    const committed = await sys.market.replicaOf(second.unitId, 1);
    const { verdictDeadline } = await sys.market.getUnit(second.unitId);
    await time.increaseTo(verdictDeadline + 1n);
    await sys.market.expireUnit(second.unitId);
    // Third unit reuses the page and overwrites it.
    const third = await h.unitAt(sys, "revealed", [h.digestOf("c"), h.digestOf("c"), h.digestOf("c")]);
    await sys.market.connect(sys.operator).finalize(third.unitId);
    for (let i = 0; i < 3; i++) expect((await sys.market.replicaOf(first.unitId, i))[1]).to.equal(same[0]);
    expect(await sys.market.replicaOf(second.unitId, 1)).to.deep.equal(committed);
    expect((await sys.market.replicaOf(second.unitId, 2))[1]).to.equal(ethers.ZeroHash);
    expect((await sys.market.replicaOf(third.unitId, 2))[1]).to.equal(h.digestOf("c"));
  });

  it("stores commitments per unit once all pages are taken, with the same behaviour", async function () {
    const sys = await loadFixture(h.systemFixture);
    const { unitId } = await h.unitAt(sys, "assigned"); // holds page 0
    // Mark all 128 pages as taken, as if 128 units were open: the counter slot is (busyPages << 128) | count.
    const counterSlot = await slotHolding(sys.market, (1n << 128n) | unitId);
    await setSlot(sys.market, counterSlot, (((1n << 128n) - 1n) << 128n) | unitId);
    const digests = [h.digestOf("x"), h.digestOf("x"), h.digestOf("y")];
    const unit = await h.unitAt(sys, "revealed", digests);
    for (let i = 0; i < 3; i++) expect((await sys.market.replicaOf(unit.unitId, i))[1]).to.equal(digests[i]);
    const sigs = [];
    for (const v of sys.verifiers.slice(0, 2)) sigs.push(await h.signVerdict(sys.market, v, unit.unitId, [0, 0, 1]));
    await sys.market.submitVerdict(unit.unitId, [0, 0, 1], sigs);
    for (let i = 0; i < 3; i++) expect((await sys.market.replicaOf(unit.unitId, i))[1]).to.equal(digests[i]);
    expect(await sys.market.unitCount()).to.equal(unitId + 1n);
    await h.expectSolvent(sys);
  });
});

describe("JobMarket: party ids at the limits", function () {
  it("packs ten parties (5 replicas, 5 verifiers) and resolves each one in views, reveals and verdicts", async function () {
    const sys = await loadFixture(h.systemFixture);
    const signers = await ethers.getSigners();
    const [extraProvider, v4, v5] = signers.slice(11, 14);
    for (const party of [extraProvider, v4, v5]) {
      await sys.token.mint(party.address, 1_000n * h.E18);
      await sys.token.connect(party).approve(sys.stakes.target, ethers.MaxUint256);
      await sys.stakes.connect(party).stake(200n * h.E18);
    }
    const providers = [...sys.providers, extraProvider];
    const verifiers = [...sys.verifiers, v4, v5];
    const { orderId } = await h.postOrder(sys, { replicas: 5, units: 1 });
    const { unitId } = await h.assignUnit(sys, orderId, { providers, verifiers });
    expect(await sys.market.verifiersOf(unitId)).to.deep.equal(verifiers.map((v) => v.address));
    const digests = [...providers.slice(0, 4).map(() => h.digestOf("good")), h.digestOf("bad")];
    await sys.market.commitBatch(unitId, await signedCommits(sys, unitId, providers, digests));
    await sys.market.connect(sys.operator).revealBatch(unitId, revealsOf(unitId, providers, digests));
    for (let i = 0; i < 5; i++) {
      expect(await sys.market.replicaOf(unitId, i)).to.deep.equal([providers[i].address, digests[i], true, true]);
    }
    const outcomes = [ACCEPT, ACCEPT, ACCEPT, ACCEPT, FAULT];
    const sigs = [];
    const v3 = sys.verifiers[2];
    for (const v of [v5, v4, v3]) sigs.push(await h.signVerdict(sys.market, v, unitId, outcomes));
    await expect(sys.market.submitVerdict(unitId, outcomes, sigs)).to.emit(sys.market, "VerdictRecorded")
      .withArgs(unitId, outcomes, h.outcomesHashOf(outcomes), [v5.address, v4.address, v3.address]);
    expect(await sys.market.credits(extraProvider.address)).to.equal(0n);
    expect(await sys.market.credits(v5.address)).to.equal(FEE / 3n);
    await h.expectSolvent(sys);
  });

  it("settles a one-replica unit (no commitment page) through the batch path", async function () {
    const sys = await loadFixture(h.systemFixture);
    const { orderId } = await h.postOrder(sys, { replicas: 1, units: 1 });
    const providers = [sys.providers[0]];
    const { unitId } = await h.assignUnit(sys, orderId, { providers });
    const digests = [h.digestOf("solo")];
    await sys.market.commitBatch(unitId, await signedCommits(sys, unitId, providers, digests));
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, revealsOf(unitId, providers, digests)))
      .to.emit(sys.market, "UnitFinalized").withArgs(unitId, digests[0]);
    expect(await sys.market.replicaOf(unitId, 0)).to.deep.equal([providers[0].address, digests[0], true, true]);
    await h.expectSolvent(sys);
  });
});

describe("JobMarket: party registry", function () {
  it("refuses to assign a never-seen address once all 2**24 - 1 party ids are taken", async function () {
    const { sys, orderId } = await loadFixture(h.assignedFixture);
    const partyCountSlot = await slotHolding(sys.market, 6n); // 3 providers + 3 verifiers registered
    await setSlot(sys.market, partyCountSlot, (1n << 24n) - 1n);
    const providers = [sys.providers[0], sys.providers[1], sys.providers[3]]; // providers[3] is new
    await expect(h.assignUnit(sys, orderId, { providers }))
      .to.be.revertedWithCustomError(sys.market, "PartyRegistryFull");
    await h.assignUnit(sys, orderId); // known parties still assignable
  });
});

describe("StakeManager: lockBatch / unlockBatch", function () {
  async function marketRoleFixture() {
    const sys = await h.systemFixture();
    await sys.stakes.grantRole(await sys.stakes.MARKET_ROLE(), sys.admin.address);
    return sys;
  }

  it("locks all or nothing, unlocks saturating, and only for MARKET_ROLE", async function () {
    const sys = await loadFixture(marketRoleFixture);
    const [a, b] = sys.providers.map((p) => p.address);
    await expect(sys.stakes.connect(sys.other).lockBatch([a], 1n))
      .to.be.revertedWithCustomError(sys.stakes, "AccessControlUnauthorizedAccount");
    await expect(sys.stakes.connect(sys.other).unlockBatch([a], 1n))
      .to.be.revertedWithCustomError(sys.stakes, "AccessControlUnauthorizedAccount");
    await sys.stakes.lock(b, 150n * h.E18);
    await expect(sys.stakes.lockBatch([a, b], 100n * h.E18))
      .to.be.revertedWithCustomError(sys.stakes, "InsufficientFreeStake").withArgs(b, 50n * h.E18, 100n * h.E18);
    expect(await sys.stakes.freeStake(a)).to.equal(200n * h.E18);
    await sys.stakes.lockBatch([a, b], 50n * h.E18);
    expect([await sys.stakes.freeStake(a), await sys.stakes.freeStake(b)]).to.deep.equal([150n * h.E18, 0n]);
    await sys.stakes.unlockBatch([a, b], 100n * h.E18);
    expect([await sys.stakes.freeStake(a), await sys.stakes.freeStake(b)]).to.deep.equal([200n * h.E18, 100n * h.E18]);
  });
});
