// JobMarket: commit, reveal, finalize, verdict and expiry of a unit.
"use strict";

const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("./chain");
const h = require("./helpers");

const { E18, PARAMS, PRICE, FEE, UNIT_STATE, ACCEPT, FAULT, FRAUD } = h;
const UNIT_COST = 3n * PRICE + FEE;

async function signCommit(sys, provider, unitId, commitment, opts = {}) {
  const nonce = opts.nonce ?? (await sys.market.nonces(provider.address));
  const deadline = opts.deadline ?? (await h.farDeadline());
  const signature = await h.signMarket(opts.signer ?? provider, sys.market, "Commit",
    { unitId, provider: provider.address, commitment, nonce, deadline }, opts);
  return { nonce, deadline, signature };
}

/** A unit where only the first `committers` providers committed (fresh unit on a fresh system). */
async function partialFixture() {
  const sys = await h.systemFixture();
  const unit = await h.unitAt(sys, "assigned");
  const digests = unit.providers.map(() => h.digestOf("same"));
  await h.commitAll(sys, unit.unitId, unit.providers.slice(0, 2), digests.slice(0, 2));
  const u = await sys.market.getUnit(unit.unitId);
  return { sys, ...unit, digests, commitDeadline: u.commitDeadline, revealDeadline: u.revealDeadline,
    verdictDeadline: u.verdictDeadline };
}

async function verdict(sys, unitId, outcomes, signers = sys.verifiers.slice(0, 2), opts = {}) {
  const sigs = [];
  for (const v of signers) sigs.push(await h.signVerdict(sys.market, v, unitId, outcomes, opts));
  return sys.market.connect(sys.other).submitVerdict(unitId, outcomes, sigs);
}

describe("JobMarket: commit", function () {
  it("records commitments and opens the reveal phase once every replica committed; the deadlines stay put",
    async function () {
    const { sys, unitId, providers } = await loadFixture(h.assignedFixture);
    const assigned = await sys.market.getUnit(unitId);
    const commitments = providers.map((p, i) => h.commitmentOf(h.digestOf("same"), h.saltOf(`${unitId}:${i}`), p.address, unitId));
    await expect(sys.market.connect(providers[0]).commit(unitId, commitments[0]))
      .to.emit(sys.market, "ReplicaCommitted").withArgs(unitId, providers[0].address, commitments[0]);
    expect(await sys.market.replicaOf(unitId, 0)).to.deep.equal([providers[0].address, commitments[0], true, false]);
    await sys.market.connect(providers[1]).commit(unitId, commitments[1]);
    const t = (await time.latest()) + 7n;
    await time.setNextBlockTimestamp(t);
    await sys.market.connect(providers[2]).commit(unitId, commitments[2]);
    const u = await sys.market.getUnit(unitId);
    // The reveal deadline was fixed at assignment (commitDeadline + revealWindow): the last commit does
    // not restart it, so the chain and the market wait for the same deadlines.
    expect([u.state, u.committedMask, u.revealDeadline, u.verdictDeadline]).to.deep.equal(
      [UNIT_STATE.Revealing, 7n, assigned.commitDeadline + PARAMS.revealWindow, assigned.verdictDeadline]);
    expect(u.revealDeadline).to.not.equal(t + PARAMS.revealWindow);
  });

  it("commitmentOf binds digest, salt, provider and unit like the off-chain helper", async function () {
    const { sys, unitId, providers } = await loadFixture(h.assignedFixture);
    const [d, salt, p] = [h.digestOf("r"), h.saltOf("s"), providers[0].address];
    expect(await sys.market.commitmentOf(d, salt, p, unitId)).to.equal(h.commitmentOf(d, salt, p, unitId));
    expect(await sys.market.commitmentOf(d, salt, providers[1].address, unitId)).to.not.equal(h.commitmentOf(d, salt, p, unitId));
  });

  it("accepts only assigned providers, once each", async function () {
    const { sys, unitId, providers } = await loadFixture(h.assignedFixture);
    await expect(sys.market.connect(sys.other).commit(unitId, ethers.id("c")))
      .to.be.revertedWithCustomError(sys.market, "NotAssignedProvider").withArgs(unitId, sys.other.address);
    await expect(sys.market.connect(sys.verifiers[0]).commit(unitId, ethers.id("c")))
      .to.be.revertedWithCustomError(sys.market, "NotAssignedProvider").withArgs(unitId, sys.verifiers[0].address);
    await sys.market.connect(providers[1]).commit(unitId, ethers.id("c"));
    await expect(sys.market.connect(providers[1]).commit(unitId, ethers.id("d")))
      .to.be.revertedWithCustomError(sys.market, "AlreadyCommitted").withArgs(unitId, providers[1].address);
    await expect(sys.market.connect(providers[1]).commit(99n, ethers.id("c")))
      .to.be.revertedWithCustomError(sys.market, "InvalidUnitState").withArgs(99n, 0);
  });

  it("accepts a commit at the commit deadline (T) and refuses it at T+1", async function () {
    const { sys, unitId, providers } = await loadFixture(h.assignedFixture);
    const { commitDeadline } = await sys.market.getUnit(unitId);
    await time.setNextBlockTimestamp(commitDeadline);
    await expect(sys.market.connect(providers[0]).commit(unitId, ethers.id("a"))).to.emit(sys.market, "ReplicaCommitted");
    await time.setNextBlockTimestamp(commitDeadline + 1n);
    await expect(sys.market.connect(providers[1]).commit(unitId, ethers.id("b")))
      .to.be.revertedWithCustomError(sys.market, "CommitWindowClosed").withArgs(unitId, commitDeadline);
  });

  it("refuses commits on a settled unit", async function () {
    const { sys, unitId, providers } = await loadFixture(h.revealedFixture);
    await sys.market.connect(sys.operator).finalize(unitId);
    await expect(sys.market.connect(providers[0]).commit(unitId, ethers.id("x")))
      .to.be.revertedWithCustomError(sys.market, "UnitAlreadySettled").withArgs(unitId);
  });

  it("commitWithSig: relayed by anyone; wrong signer, replay, expiry and other chain rejected", async function () {
    const { sys, unitId, providers } = await loadFixture(h.assignedFixture);
    const p = providers[0];
    const c = ethers.id("commitment");
    const send = (s) => sys.market.connect(sys.other).commitWithSig(unitId, p.address, c, s.nonce, s.deadline, s.signature);
    await expect(send(await signCommit(sys, p, unitId, c, { signer: sys.other })))
      .to.be.revertedWithCustomError(sys.market, "InvalidSigner").withArgs(p.address, sys.other.address);
    await expect(send(await signCommit(sys, p, unitId, c, { chainIdDelta: 1n })))
      .to.be.revertedWithCustomError(sys.market, "InvalidSigner");
    const deadline = (await time.latest()) + 3n;
    const expiring = await signCommit(sys, p, unitId, c, { deadline });
    await time.setNextBlockTimestamp(deadline + 1n);
    await expect(send(expiring)).to.be.revertedWithCustomError(sys.market, "SignatureExpired").withArgs(deadline, deadline + 1n);
    const good = await signCommit(sys, p, unitId, c);
    await expect(send(good)).to.emit(sys.market, "ReplicaCommitted").withArgs(unitId, p.address, c);
    await expect(send(good)).to.be.revertedWithCustomError(sys.market, "InvalidNonce").withArgs(p.address, 1n, 0n);
  });
});

describe("JobMarket: reveal", function () {
  it("is permissionless: anyone relays a reveal whose preimage matches", async function () {
    const { sys, unitId, providers, digests } = await loadFixture(h.committedFixture);
    await expect(sys.market.connect(sys.other).reveal(unitId, providers[0].address, digests[0], h.saltOf(`${unitId}:0`)))
      .to.emit(sys.market, "ReplicaRevealed").withArgs(unitId, providers[0].address, digests[0]);
    expect(await sys.market.replicaOf(unitId, 0)).to.deep.equal([providers[0].address, digests[0], true, true]);
    await expect(sys.market.reveal(unitId, providers[0].address, digests[0], h.saltOf(`${unitId}:0`)))
      .to.be.revertedWithCustomError(sys.market, "AlreadyRevealed").withArgs(unitId, providers[0].address);
  });

  it("rejects a wrong salt, a wrong digest, a copied commitment and non-providers", async function () {
    const sys = await loadFixture(h.systemFixture);
    const { unitId, providers } = await h.unitAt(sys, "assigned");
    const [p1, p2, p3] = providers;
    const c1 = h.commitmentOf(h.digestOf("honest"), h.saltOf("s1"), p1.address, unitId);
    await sys.market.connect(p1).commit(unitId, c1);
    await sys.market.connect(p2).commit(unitId, c1); // p2 copies p1's commitment
    await sys.market.connect(p3).commit(unitId, h.commitmentOf(h.digestOf("honest"), h.saltOf("s3"), p3.address, unitId));
    await expect(sys.market.reveal(unitId, p1.address, h.digestOf("honest"), h.saltOf("wrong")))
      .to.be.revertedWithCustomError(sys.market, "RevealMismatch").withArgs(unitId, p1.address);
    await expect(sys.market.reveal(unitId, p1.address, h.digestOf("other"), h.saltOf("s1")))
      .to.be.revertedWithCustomError(sys.market, "RevealMismatch").withArgs(unitId, p1.address);
    await expect(sys.market.reveal(unitId, p2.address, h.digestOf("honest"), h.saltOf("s1")))
      .to.be.revertedWithCustomError(sys.market, "RevealMismatch").withArgs(unitId, p2.address);
    await expect(sys.market.reveal(unitId, sys.other.address, h.digestOf("honest"), h.saltOf("s1")))
      .to.be.revertedWithCustomError(sys.market, "NotAssignedProvider").withArgs(unitId, sys.other.address);
    await expect(sys.market.reveal(unitId, p1.address, h.digestOf("honest"), h.saltOf("s1")))
      .to.emit(sys.market, "ReplicaRevealed");
  });

  it("opens after the commit deadline when a replica never committed: T refused, T+1 allowed", async function () {
    const { sys, unitId, providers, digests, commitDeadline } = await loadFixture(partialFixture);
    await time.setNextBlockTimestamp(commitDeadline);
    await expect(sys.market.reveal(unitId, providers[0].address, digests[0], h.saltOf(`${unitId}:0`)))
      .to.be.revertedWithCustomError(sys.market, "RevealWindowNotOpen").withArgs(unitId, commitDeadline);
    await time.setNextBlockTimestamp(commitDeadline + 1n);
    await expect(sys.market.reveal(unitId, providers[0].address, digests[0], h.saltOf(`${unitId}:0`)))
      .to.emit(sys.market, "ReplicaRevealed");
    await expect(sys.market.reveal(unitId, providers[2].address, digests[2], h.saltOf(`${unitId}:2`)))
      .to.be.revertedWithCustomError(sys.market, "NotCommitted").withArgs(unitId, providers[2].address);
  });

  it("refuses unknown and settled units", async function () {
    const { sys, unitId, providers, digests } = await loadFixture(h.revealedFixture);
    await expect(sys.market.reveal(88n, providers[0].address, digests[0], h.saltOf("x")))
      .to.be.revertedWithCustomError(sys.market, "InvalidUnitState").withArgs(88n, 0);
    await sys.market.connect(sys.operator).finalize(unitId);
    await expect(sys.market.reveal(unitId, providers[0].address, digests[0], h.saltOf(`${unitId}:0`)))
      .to.be.revertedWithCustomError(sys.market, "UnitAlreadySettled").withArgs(unitId);
  });

  it("closes at the reveal deadline: T allowed, T+1 refused", async function () {
    const { sys, unitId, providers, digests, revealDeadline } = await loadFixture(partialFixture);
    await time.setNextBlockTimestamp(revealDeadline);
    await expect(sys.market.reveal(unitId, providers[0].address, digests[0], h.saltOf(`${unitId}:0`)))
      .to.emit(sys.market, "ReplicaRevealed");
    await time.setNextBlockTimestamp(revealDeadline + 1n);
    await expect(sys.market.reveal(unitId, providers[1].address, digests[1], h.saltOf(`${unitId}:1`)))
      .to.be.revertedWithCustomError(sys.market, "RevealWindowClosed").withArgs(unitId, revealDeadline);
  });
});

describe("JobMarket: finalize", function () {
  it("pays every replica, releases collateral, returns the verifier fee and counts reputation", async function () {
    const { sys, unitId, orderId, providers, digests } = await loadFixture(h.revealedFixture);
    await expect(sys.market.connect(sys.operator).finalize(unitId))
      .to.emit(sys.market, "UnitFinalized").withArgs(unitId, digests[0]);
    for (const p of providers) {
      expect(await sys.market.credits(p.address)).to.equal(PRICE);
      expect(await sys.market.reputationOf(p.address)).to.deep.equal([1n, 0n, 0n, 1n]);
      expect((await sys.stakes.stakeOf(p.address))[1]).to.equal(0n);
    }
    const o = await sys.market.getOrder(orderId);
    expect([o.balance, o.delivered, o.openUnits]).to.deep.equal([UNIT_COST + FEE, 1n, 0n]);
    expect((await sys.market.getUnit(unitId)).state).to.equal(UNIT_STATE.Finalized);
    expect(await sys.market.totalEscrow()).to.equal(UNIT_COST + FEE);
    expect(await sys.market.totalCredits()).to.equal(3n * PRICE);
    await h.expectSolvent(sys);
  });

  it("is the operator's until the verdict deadline, then anyone's; such a unit cannot be expired instead",
    async function () {
      // Before: the operator checks reveals against canaries' known answers first. After: an operator that
      // never finalizes cannot keep the providers from their pay, nor let the buyer expire the unit.
      const { sys, unitId, providers, digests } = await loadFixture(h.revealedFixture);
      const { verdictDeadline } = await sys.market.getUnit(unitId);
      await expect(sys.market.connect(providers[0]).finalize(unitId))
        .to.be.revertedWithCustomError(sys.market, "FinalizeReserved").withArgs(unitId, verdictDeadline);
      await time.setNextBlockTimestamp(verdictDeadline);
      await expect(sys.market.connect(sys.other).finalize(unitId))
        .to.be.revertedWithCustomError(sys.market, "FinalizeReserved").withArgs(unitId, verdictDeadline);
      await time.setNextBlockTimestamp(verdictDeadline + 1n);
      await expect(sys.market.connect(sys.buyer).expireUnit(unitId))
        .to.be.revertedWithCustomError(sys.market, "UnitFinalizable").withArgs(unitId);
      await expect(sys.market.connect(providers[0]).finalize(unitId))
        .to.emit(sys.market, "UnitFinalized").withArgs(unitId, digests[0]);
      for (const p of providers) expect(await sys.market.credits(p.address)).to.equal(PRICE);
      await h.expectSolvent(sys);
    });

  it("lets a unanimous unit drawn for verification expire when no verdict came", async function () {
    const { sys, unitId } = await loadFixture(h.revealedFixture);
    await sys.market.connect(sys.operator).requestVerification(unitId);
    const { verdictDeadline } = await sys.market.getUnit(unitId);
    await time.setNextBlockTimestamp(verdictDeadline + 1n);
    await expect(sys.market.connect(sys.buyer).expireUnit(unitId)).to.emit(sys.market, "UnitExpired").withArgs(unitId);
  });

  it("settles only once: a second finalize, a verdict or an expiry revert", async function () {
    const { sys, unitId } = await loadFixture(h.revealedFixture);
    await sys.market.connect(sys.operator).finalize(unitId);
    await expect(sys.market.connect(sys.operator).finalize(unitId)).to.be.revertedWithCustomError(sys.market, "UnitAlreadySettled").withArgs(unitId);
    await expect(verdict(sys, unitId, [ACCEPT, ACCEPT, ACCEPT]))
      .to.be.revertedWithCustomError(sys.market, "UnitAlreadySettled").withArgs(unitId);
    await time.increase(10_000n);
    await expect(sys.market.expireUnit(unitId)).to.be.revertedWithCustomError(sys.market, "UnitAlreadySettled").withArgs(unitId);
  });

  it("refuses differing digests, missing reveals, drawn units and unknown units", async function () {
    const { sys, unitId } = await loadFixture(h.disputedFixture);
    await expect(sys.market.connect(sys.operator).finalize(unitId)).to.be.revertedWithCustomError(sys.market, "NotUnanimous").withArgs(unitId);
    const { sys: s2, unitId: u2 } = await loadFixture(h.committedFixture);
    await expect(s2.market.connect(s2.operator).finalize(u2)).to.be.revertedWithCustomError(s2.market, "RevealsIncomplete").withArgs(u2);
    await expect(s2.market.connect(s2.operator).finalize(55n)).to.be.revertedWithCustomError(s2.market, "InvalidUnitState").withArgs(55n, 0);
    const { sys: s3, unitId: u3 } = await loadFixture(h.revealedFixture);
    await s3.market.connect(s3.operator).requestVerification(u3);
    await expect(s3.market.connect(s3.operator).finalize(u3)).to.be.revertedWithCustomError(s3.market, "UnitUnderVerification").withArgs(u3);
  });
});

describe("JobMarket: submitVerdict", function () {
  it("pays accepted replicas and the fee to signers, and holds fraud (no slash, collateral locked, price escrowed)",
    async function () {
      const { sys, unitId, orderId, providers } = await loadFixture(h.disputedFixture);
      const [p1, p2, p3] = providers;
      const [v1, v2] = sys.verifiers;
      const tx = verdict(sys, unitId, [ACCEPT, ACCEPT, FRAUD]);
      await expect(tx).to.emit(sys.market, "FraudHeld").withArgs(unitId, 0b100);
      await expect(tx).to.not.emit(sys.market, "ReplicaSlashed");
      await expect(tx).to.emit(sys.market, "VerdictRecorded")
        .withArgs(unitId, [ACCEPT, ACCEPT, FRAUD], h.outcomesHashOf([ACCEPT, ACCEPT, FRAUD]), [v1.address, v2.address]);
      expect(await sys.market.credits(p1.address)).to.equal(PRICE);
      expect(await sys.market.credits(p2.address)).to.equal(PRICE);
      expect(await sys.market.credits(p3.address)).to.equal(0n);
      expect(await sys.market.credits(v1.address)).to.equal(FEE / 2n); // the fee only: no bounty yet
      expect(await sys.market.credits(v2.address)).to.equal(FEE / 2n);
      expect(await sys.market.credits(sys.verifiers[2].address)).to.equal(0n);
      expect(await sys.market.credits(sys.buyer.address)).to.equal(FEE - 2n * (FEE / 2n));
      expect(await sys.market.reputationOf(p1.address)).to.deep.equal([1n, 0n, 0n, 1n]);
      // the accusation counts at once (matching declines it); an acquittal by the truth takes it back
      expect(await sys.market.reputationOf(p3.address)).to.deep.equal([0n, 0n, 1n, 0n]);
      expect(await sys.stakes.stakeOf(p3.address)).to.deep.equal([200n * E18, PARAMS.providerCollateral, 0n, 0n]);
      for (const p of [p1, p2]) expect((await sys.stakes.stakeOf(p.address))[1]).to.equal(0n);
      const o = await sys.market.getOrder(orderId);
      expect([o.balance, o.delivered, o.openUnits]).to.deep.equal([UNIT_COST, 1n, 0n]); // p3's price stays escrowed
      expect((await sys.market.getUnit(unitId)).state).to.equal(UNIT_STATE.Verdicted);
      const verdictTime = (await ethers.provider.getBlock((await (await tx).wait()).blockNumber)).timestamp;
      expect(await sys.market.heldOf(unitId)).to.deep.equal([0b100n, BigInt(verdictTime)]);
      expect(await sys.market.totalCredits()).to.equal(2n * PRICE + FEE);
      expect(await sys.market.totalEscrow()).to.equal(UNIT_COST + PRICE);
      await h.expectSolvent(sys);
      await expect(verdict(sys, unitId, [ACCEPT, ACCEPT, FRAUD]))
        .to.be.revertedWithCustomError(sys.market, "UnitAlreadySettled").withArgs(unitId);
      await expect(sys.market.connect(sys.operator).finalize(unitId)).to.be.revertedWithCustomError(sys.market, "UnitAlreadySettled");
    });

  it("settleHeld by the verdict slashes held fraud: bounty to the verdict's signers, the rest and the price to the buyer",
    async function () {
      const { sys, unitId, orderId, providers } = await loadFixture(h.disputedFixture);
      const [, , p3] = providers;
      const [v1, v2, v3] = sys.verifiers;
      const outcomes = [ACCEPT, ACCEPT, FRAUD];
      await verdict(sys, unitId, outcomes, [v1, v2]);
      await sys.market.connect(sys.admin).grantRole(await sys.market.APPEALS_ROLE(), sys.admin.address);
      expect(await sys.market.connect(sys.admin).settleHeld.staticCall(unitId, outcomes, outcomes)).to.equal(0n);
      const tx = sys.market.connect(sys.admin).settleHeld(unitId, outcomes, outcomes);
      await expect(tx).to.emit(sys.market, "ReplicaSlashed").withArgs(unitId, p3.address, PARAMS.slashAmount);
      await expect(tx).to.emit(sys.market, "HeldSettled").withArgs(unitId, outcomes);
      await expect(tx).to.changeTokenBalances(sys.token, [sys.admin, sys.market], [0n, PARAMS.slashAmount]);
      const bounty = (PARAMS.slashAmount * BigInt(PARAMS.bountyBps)) / 10_000n;
      const share = FEE / 2n + bounty / 2n;
      expect(await sys.market.credits(v1.address)).to.equal(share);
      expect(await sys.market.credits(v2.address)).to.equal(share);
      expect(await sys.market.credits(v3.address)).to.equal(0n);
      expect(await sys.market.credits(p3.address)).to.equal(0n);
      expect(await sys.market.credits(sys.buyer.address)).to.equal(PARAMS.slashAmount - bounty + PRICE);
      expect(await sys.market.reputationOf(p3.address)).to.deep.equal([0n, 0n, 1n, 0n]);
      expect(await sys.stakes.stakeOf(p3.address)).to.deep.equal([200n * E18 - PARAMS.slashAmount, 0n, 0n, 0n]);
      expect((await sys.market.getOrder(orderId)).balance).to.equal(UNIT_COST); // the refund went to credit
      expect(await sys.market.heldOf(unitId)).to.deep.equal([0n, 0n]);
      expect(await sys.market.totalCredits()).to.equal(3n * PRICE + FEE + PARAMS.slashAmount);
      expect(await sys.market.totalEscrow()).to.equal(UNIT_COST);
      await h.expectSolvent(sys);
      // settled once: a second call (by a truth with no fraud) is a no-op
      await expect(sys.market.connect(sys.admin).settleHeld(unitId, outcomes, [ACCEPT, ACCEPT, ACCEPT]))
        .to.not.emit(sys.market, "HeldSettled");
      expect(await sys.market.credits(p3.address)).to.equal(0n);
    });

  it("settleHeld by a truth that overturns the verdict pays a framed replica, and sends a cheat's slash to the caller",
    async function () {
      const { sys, unitId, providers } = await loadFixture(h.disputedFixture);
      const [p1, , p3] = providers;
      const [v1, v2] = sys.verifiers;
      const framed = [FRAUD, ACCEPT, FRAUD];
      await expect(verdict(sys, unitId, framed, [v1, v2])).to.emit(sys.market, "FraudHeld").withArgs(unitId, 0b101);
      expect((await sys.stakes.stakeOf(p1.address))[1]).to.equal(PARAMS.providerCollateral);
      const appeals = sys.other; // stands in for VerdictAppeals
      await sys.market.connect(sys.admin).grantRole(await sys.market.APPEALS_ROLE(), appeals.address);
      const truth = [ACCEPT, ACCEPT, FRAUD];
      expect(await sys.market.connect(appeals).settleHeld.staticCall(unitId, framed, truth)).to.equal(PARAMS.slashAmount);
      const tx = sys.market.connect(appeals).settleHeld(unitId, framed, truth);
      await expect(tx).to.emit(sys.market, "ReplicaSlashed").withArgs(unitId, p3.address, PARAMS.slashAmount);
      await expect(tx).to.emit(sys.market, "HeldSettled").withArgs(unitId, truth);
      await expect(tx).to.changeTokenBalances(sys.token, [appeals, sys.market], [PARAMS.slashAmount, 0n]);
      expect(await sys.market.credits(p1.address)).to.equal(PRICE);
      expect(await sys.market.reputationOf(p1.address)).to.deep.equal([1n, 0n, 0n, 1n]);
      expect(await sys.stakes.stakeOf(p1.address)).to.deep.equal([200n * E18, 0n, 0n, 0n]);
      expect(await sys.market.reputationOf(p3.address)).to.deep.equal([0n, 0n, 1n, 0n]);
      for (const v of [v1, v2]) expect(await sys.market.credits(v.address)).to.equal(FEE / 2n); // no bounty
      expect(await sys.market.credits(sys.buyer.address)).to.equal(PRICE); // p3's price; its slash went to the caller
      await h.expectSolvent(sys);
    });

  it("settleHeld: only APPEALS_ROLE, only with the unit's verdict, and a no-op for a standing verdict with nothing held",
    async function () {
    const { sys, unitId } = await loadFixture(h.disputedFixture);
    const outcomes = [ACCEPT, ACCEPT, FRAUD];
    await verdict(sys, unitId, outcomes);
    const role = await sys.market.APPEALS_ROLE();
    for (const caller of [sys.other, sys.admin, sys.operator]) {
      await expect(sys.market.connect(caller).settleHeld(unitId, outcomes, outcomes))
        .to.be.revertedWithCustomError(sys.market, "AccessControlUnauthorizedAccount").withArgs(caller.address, role);
    }
    await sys.market.connect(sys.admin).grantRole(role, sys.admin.address);
    await expect(sys.market.connect(sys.admin).settleHeld(unitId, [ACCEPT, ACCEPT, ACCEPT], outcomes))
      .to.be.revertedWithCustomError(sys.market, "VerdictMismatch").withArgs(unitId);
    const { sys: s2, unitId: u2 } = await loadFixture(h.revealedFixture);
    await s2.market.connect(s2.admin).grantRole(role, s2.admin.address);
    await s2.market.connect(s2.operator).finalize(u2); // no verdict: nothing to settle by
    await expect(s2.market.connect(s2.admin).settleHeld(u2, [ACCEPT, ACCEPT, ACCEPT], [ACCEPT, ACCEPT, ACCEPT]))
      .to.be.revertedWithCustomError(s2.market, "VerdictMismatch").withArgs(u2);
    const { sys: s3, unitId: u3 } = await loadFixture(h.disputedFixture);
    await s3.market.connect(s3.admin).grantRole(role, s3.admin.address);
    await verdict(s3, u3, [ACCEPT, ACCEPT, ACCEPT]); // nothing held
    const all = [ACCEPT, ACCEPT, ACCEPT];
    expect(await s3.market.connect(s3.admin).settleHeld.staticCall(u3, all, all)).to.equal(0n);
    await expect(s3.market.connect(s3.admin).settleHeld(u3, all, all)).to.not.emit(s3.market, "HeldSettled");
  });

  it("settles a drawn unit: all accepted, the verifier fee goes to the signers", async function () {
    const { sys, unitId, providers } = await loadFixture(h.revealedFixture);
    await sys.market.connect(sys.operator).requestVerification(unitId);
    await verdict(sys, unitId, [ACCEPT, ACCEPT, ACCEPT], sys.verifiers);
    for (const p of providers) expect(await sys.market.credits(p.address)).to.equal(PRICE);
    for (const v of sys.verifiers) expect(await sys.market.credits(v.address)).to.equal(FEE / 3n);
    expect(await sys.market.credits(sys.buyer.address)).to.equal(FEE - 3n * (FEE / 3n));
    await h.expectSolvent(sys);
  });

  it("records a fault for a replica that never committed (unpaid, not slashed) after the reveal deadline",
    async function () {
      const { sys, unitId, orderId, providers, digests, revealDeadline } = await loadFixture(partialFixture);
      await time.increaseTo(revealDeadline - 5n);
      for (const i of [0, 1]) await sys.market.reveal(unitId, providers[i].address, digests[i], h.saltOf(`${unitId}:${i}`));
      await expect(verdict(sys, unitId, [ACCEPT, ACCEPT, FAULT]))
        .to.be.revertedWithCustomError(sys.market, "VerdictWindowNotOpen").withArgs(unitId, revealDeadline);
      await time.setNextBlockTimestamp(revealDeadline + 1n);
      await expect(verdict(sys, unitId, [ACCEPT, ACCEPT, ACCEPT]))
        .to.be.revertedWithCustomError(sys.market, "InvalidOutcome").withArgs(2n, ACCEPT);
      await verdict(sys, unitId, [ACCEPT, ACCEPT, FAULT]);
      const p3 = providers[2];
      expect(await sys.market.reputationOf(p3.address)).to.deep.equal([0n, 1n, 0n, 0n]);
      expect(await sys.stakes.stakeOf(p3.address)).to.deep.equal([200n * E18, 0n, 0n, 0n]);
      expect((await sys.market.getOrder(orderId)).balance).to.equal(UNIT_COST + PRICE);
      await h.expectSolvent(sys);
    });

  it("closes at the verdict deadline: T allowed, T+1 refused", async function () {
    const { sys, unitId, verdictDeadline } = await loadFixture(partialFixture);
    const outcomes = [FAULT, FAULT, FAULT];
    const sigs = [];
    for (const v of sys.verifiers.slice(0, 2)) {
      sigs.push(await h.signVerdict(sys.market, v, unitId, outcomes, { deadline: verdictDeadline + 10n }));
    }
    await time.setNextBlockTimestamp(verdictDeadline + 1n);
    await expect(sys.market.submitVerdict(unitId, outcomes, sigs))
      .to.be.revertedWithCustomError(sys.market, "VerdictWindowClosed").withArgs(unitId, verdictDeadline);
    const { sys: s2, unitId: u2, verdictDeadline: d2 } = await loadFixture(partialFixture);
    const sigs2 = [];
    for (const v of s2.verifiers.slice(0, 2)) {
      sigs2.push(await h.signVerdict(s2.market, v, u2, outcomes, { deadline: d2 + 10n }));
    }
    await time.setNextBlockTimestamp(d2);
    await expect(s2.market.submitVerdict(u2, outcomes, sigs2)).to.emit(s2.market, "VerdictRecorded");
  });

  it("an all-failed unit can be re-assigned while the order balance covers it", async function () {
    const { sys, orderId, unitId } = await loadFixture(h.disputedFixture);
    await verdict(sys, unitId, [FAULT, FAULT, FAULT]);
    const o = await sys.market.getOrder(orderId);
    expect([o.balance, o.delivered]).to.deep.equal([UNIT_COST + 3n * PRICE, 0n]);
    await h.assignUnit(sys, orderId, { unitKey: ethers.id("retry") });
    await expect(h.assignUnit(sys, orderId, { unitKey: ethers.id("retry2") }))
      .to.be.revertedWithCustomError(sys.market, "NoUnitBudget").withArgs(orderId);
  });

  it("refuses a verdict without quorum", async function () {
    const { sys, unitId } = await loadFixture(h.disputedFixture);
    await expect(verdict(sys, unitId, [ACCEPT, ACCEPT, FRAUD], sys.verifiers.slice(0, 1)))
      .to.be.revertedWithCustomError(sys.market, "QuorumNotReached").withArgs(unitId, 1n, 2n);
  });

  it("refuses non-assigned verifiers, duplicate signers, wrong signers, expiry and other chains",
    async function () {
      const { sys, unitId } = await loadFixture(h.disputedFixture);
      const outcomes = [ACCEPT, ACCEPT, FRAUD];
      const [v1, v2] = sys.verifiers;
      const submit = (sigs) => sys.market.submitVerdict(unitId, outcomes, sigs);
      const good1 = await h.signVerdict(sys.market, v1, unitId, outcomes);
      const good2 = await h.signVerdict(sys.market, v2, unitId, outcomes);
      const outsider = await h.signVerdict(sys.market, sys.other, unitId, outcomes);
      await expect(submit([good1, outsider]))
        .to.be.revertedWithCustomError(sys.market, "NotAssignedVerifier").withArgs(unitId, sys.other.address);
      const byProvider = await h.signVerdict(sys.market, sys.providers[0], unitId, outcomes);
      await expect(submit([good1, byProvider]))
        .to.be.revertedWithCustomError(sys.market, "NotAssignedVerifier").withArgs(unitId, sys.providers[0].address);
      await expect(submit([good1, good1])).to.be.revertedWithCustomError(sys.market, "DuplicateParty").withArgs(v1.address);
      const forged = await h.signVerdict(sys.market, v2, unitId, outcomes, { signer: sys.other });
      await expect(submit([good1, forged]))
        .to.be.revertedWithCustomError(sys.market, "InvalidSigner").withArgs(v2.address, sys.other.address);
      const otherChain = await h.signVerdict(sys.market, v2, unitId, outcomes, { chainIdDelta: 1n });
      await expect(submit([good1, otherChain])).to.be.revertedWithCustomError(sys.market, "InvalidSigner");
      const differentOutcomes = await h.signVerdict(sys.market, v2, unitId, [ACCEPT, ACCEPT, FAULT]);
      await expect(submit([good1, differentOutcomes])).to.be.revertedWithCustomError(sys.market, "InvalidSigner");
      const deadline = (await time.latest()) + 3n;
      const expiring = await h.signVerdict(sys.market, v2, unitId, outcomes, { deadline });
      await time.setNextBlockTimestamp(deadline + 1n);
      await expect(submit([good1, expiring]))
        .to.be.revertedWithCustomError(sys.market, "SignatureExpired").withArgs(deadline, deadline + 1n);
      await expect(submit([good1, good2])).to.emit(sys.market, "VerdictRecorded");
    });

  it("refuses a wrong outcome count, unknown outcomes and a verdict before the window opens", async function () {
    const { sys, unitId } = await loadFixture(h.disputedFixture);
    await expect(verdict(sys, unitId, [ACCEPT, ACCEPT]))
      .to.be.revertedWithCustomError(sys.market, "OutcomeCountMismatch").withArgs(3n, 2n);
    await expect(verdict(sys, unitId, [ACCEPT, ACCEPT, 3]))
      .to.be.revertedWithCustomError(sys.market, "InvalidOutcome").withArgs(2n, 3);
    const { sys: s2, unitId: u2 } = await loadFixture(h.committedFixture);
    const { revealDeadline } = await s2.market.getUnit(u2);
    await expect(verdict(s2, u2, [FAULT, FAULT, FAULT]))
      .to.be.revertedWithCustomError(s2.market, "VerdictWindowNotOpen").withArgs(u2, revealDeadline);
    await expect(verdict(s2, 99n, [FAULT])).to.be.revertedWithCustomError(s2.market, "InvalidUnitState").withArgs(99n, 0);
  });
});

describe("JobMarket: verdict quorum and verifier collateral", function () {
  /** A disputed 3-replica unit with five assigned verifiers (majority: three). */
  async function fiveVerifierFixture() {
    const sys = await h.systemFixture();
    const extra = (await ethers.getSigners()).slice(11, 13);
    for (const s of extra) {
      await sys.token.mint(s.address, 1_000n * E18);
      await sys.token.connect(s).approve(await sys.stakes.getAddress(), ethers.MaxUint256);
      await sys.stakes.connect(s).stake(200n * E18);
    }
    const verifiers = [...sys.verifiers, ...extra];
    const unit = await h.unitAt(sys, "revealed", [h.digestOf("good"), h.digestOf("good"), h.digestOf("bad")],
      { verifiers });
    return { sys, ...unit };
  }

  it("needs a majority of the unit's assigned verifiers, not a global minimum", async function () {
    const { sys, unitId, verifiers } = await loadFixture(fiveVerifierFixture);
    const outcomes = [ACCEPT, ACCEPT, FAULT];
    await expect(verdict(sys, unitId, outcomes, verifiers.slice(0, 2)))
      .to.be.revertedWithCustomError(sys.market, "QuorumNotReached").withArgs(unitId, 2n, 3n);
    await expect(verdict(sys, unitId, outcomes, verifiers.slice(2))).to.emit(sys.market, "VerdictRecorded");
  });

  it("locks each verifier's collateral for the unit (no unstaking it) and releases it at settlement",
    async function () {
      const { sys, unitId } = await loadFixture(h.disputedFixture);
      const [v1, v2, v3] = sys.verifiers;
      const free = 200n * E18 - PARAMS.verifierCollateral;
      expect(await sys.stakes.freeStake(v1.address)).to.equal(free);
      await expect(sys.stakes.connect(v1).requestUnstake(200n * E18))
        .to.be.revertedWithCustomError(sys.stakes, "InsufficientFreeStake").withArgs(v1.address, free, 200n * E18);
      await verdict(sys, unitId, [ACCEPT, ACCEPT, FAULT], [v1, v2]);
      for (const v of [v1, v2, v3]) expect((await sys.stakes.stakeOf(v.address))[1]).to.equal(0n);
      await sys.stakes.connect(v3).requestUnstake(200n * E18);
      // The fast path releases them too.
      const { sys: s2, unitId: u2 } = await loadFixture(h.revealedFixture);
      expect((await s2.stakes.stakeOf(v1.address))[1]).to.equal(PARAMS.verifierCollateral);
      await s2.market.connect(s2.operator).finalize(u2);
      for (const v of s2.verifiers) expect((await s2.stakes.stakeOf(v.address))[1]).to.equal(0n);
      await h.expectSolvent(s2);
    });

  it("keeps the settling verdict's outcomes hash for appeals, and slashes no verifier itself", async function () {
    const { sys, unitId } = await loadFixture(h.disputedFixture);
    const [v1, v2] = sys.verifiers;
    const settled = [ACCEPT, ACCEPT, FRAUD];
    expect(await sys.market.verdictHashOf(unitId)).to.equal(ethers.ZeroHash);
    await verdict(sys, unitId, settled, [v1, v2]);
    expect(await sys.market.verdictHashOf(unitId)).to.equal(h.outcomesHashOf(settled));
    // a contradicting verifier is slashed only through VerdictAppeals, once a referee fixed the truth
    expect(sys.market.interface.getFunction("slashContradictingVerifier")).to.equal(null);
    const { sys: s2, unitId: u2 } = await loadFixture(h.revealedFixture);
    await s2.market.connect(s2.operator).finalize(u2);
    expect(await s2.market.verdictHashOf(u2)).to.equal(ethers.ZeroHash);
  });
});

describe("JobMarket: expireUnit", function () {
  it("after the verdict deadline (T refused, T+1 allowed) releases collateral, counts faults, returns the budget",
    async function () {
      const sys = await loadFixture(h.systemFixture);
      const first = await h.unitAt(sys, "revealed");
      await sys.market.connect(sys.operator).finalize(first.unitId); // p1..p3 now have one valid unit each
      const { unitId, providers } = await h.assignUnit(sys, first.orderId);
      await h.commitAll(sys, unitId, providers, providers.map(() => h.digestOf("x")));
      await sys.market.reveal(unitId, providers[0].address, h.digestOf("x"), h.saltOf(`${unitId}:0`));
      const { verdictDeadline } = await sys.market.getUnit(unitId);
      await time.setNextBlockTimestamp(verdictDeadline);
      await expect(sys.market.connect(sys.other).expireUnit(unitId))
        .to.be.revertedWithCustomError(sys.market, "UnitNotExpired").withArgs(unitId, verdictDeadline);
      await time.setNextBlockTimestamp(verdictDeadline + 1n);
      await expect(sys.market.connect(sys.other).expireUnit(unitId)).to.emit(sys.market, "UnitExpired").withArgs(unitId);
      expect(await sys.market.reputationOf(providers[0].address)).to.deep.equal([1n, 0n, 0n, 1n]);
      expect(await sys.market.reputationOf(providers[1].address)).to.deep.equal([1n, 1n, 0n, 0n]);
      for (const p of providers) expect((await sys.stakes.stakeOf(p.address))[1]).to.equal(0n);
      for (const v of sys.verifiers) expect((await sys.stakes.stakeOf(v.address))[1]).to.equal(0n);
      // The verifiers let the unit expire: the fee returned to the order with the rest, they earn nothing.
      for (const v of sys.verifiers) expect(await sys.market.credits(v.address)).to.equal(0n);
      const o = await sys.market.getOrder(first.orderId);
      expect([o.balance, o.delivered, o.openUnits]).to.deep.equal([UNIT_COST + FEE, 1n, 0n]);
      expect((await sys.market.getUnit(unitId)).state).to.equal(UNIT_STATE.Expired);
      await expect(sys.market.expireUnit(unitId)).to.be.revertedWithCustomError(sys.market, "UnitAlreadySettled");
      await expect(sys.market.expireUnit(1234n)).to.be.revertedWithCustomError(sys.market, "InvalidUnitState");
      await h.assignUnit(sys, first.orderId, { unitKey: ethers.id("again") });
      await h.expectSolvent(sys);
    });
});

describe("JobMarket: the verdict path's own contract", function () {
  it("runs only inside JobMarket: called on its own address, each of its actions reverts NotDelegated",
    async function () {
      const sys = await loadFixture(h.systemFixture);
      const verdicts = await ethers.getContractAt("JobMarketExtension", await sys.market.extension());
      expect(await ethers.provider.getCode(await verdicts.getAddress())).to.not.equal("0x");
      const unit = await h.unitAt(sys, "revealed");
      // one at a time: a call is sent when its thunk runs, so no rejection is left unawaited
      for (const call of [
        () => verdicts.submitVerdict(unit.unitId, [ACCEPT, ACCEPT, ACCEPT], []),
        () => verdicts.settleHeld(unit.unitId, [ACCEPT, ACCEPT, ACCEPT], [ACCEPT, ACCEPT, ACCEPT]),
        () => verdicts.expireUnit(unit.unitId),
      ]) {
        await expect(call()).to.be.revertedWithCustomError(verdicts, "NotDelegated");
      }
      // through JobMarket the same calls reach the unit (here refused by its own rules)
      await expect(sys.market.expireUnit(unit.unitId)).to.be.revertedWithCustomError(sys.market, "UnitNotExpired");
    });
});
