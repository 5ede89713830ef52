// VerdictAppeals: a refereed appeal of a unit's verdict, and the only way to slash a contradicting verifier.
"use strict";

const { expect } = require("chai");
const { ethers, network } = require("hardhat");
const { loadFixture, time } = require("./chain");
const h = require("./helpers");

const { E18, PARAMS, PRICE, FEE, ACCEPT, FAULT, FRAUD } = h;
const { APPEAL_PARAMS } = h;
const STAKE = 200n * E18;
const TRUTH = [ACCEPT, ACCEPT, FRAUD]; // replica 3 returned a wrong result
const COLLUDED = [ACCEPT, ACCEPT, ACCEPT];
const APPEAL_STATE = { None: 0n, Pending: 1n, Confirmed: 2n, Overturned: 3n, Lapsed: 4n };

/** The system plus the appeals contract (holding the stake manager's MARKET_ROLE and the market's
 * APPEALS_ROLE) and five staked referees in its pool. */
async function appealsSystem() {
  const sys = await h.systemFixture();
  const signers = await ethers.getSigners();
  const referees = signers.slice(11, 16);
  const appeals = await h.deployAppeals(sys);
  for (const r of referees) {
    await sys.token.mint(r.address, 1_000n * E18);
    await sys.token.connect(r).approve(await sys.stakes.getAddress(), ethers.MaxUint256);
    await sys.stakes.connect(r).stake(STAKE);
    await appeals.connect(r).joinPool();
  }
  return { ...sys, appeals, referees, spare: signers.slice(16, 19) };
}

async function verdict(sys, unitId, outcomes, signers) {
  const sigs = [];
  for (const v of signers) sigs.push(await h.signVerdict(sys.market, v, unitId, outcomes));
  return sys.market.connect(sys.other).submitVerdict(unitId, outcomes, sigs);
}

/** Replica 3 cheats; verifiers 2 and 3 collude with it and settle accept-all; verifier 1 signed the truth. */
async function colludedFixture() {
  const sys = await appealsSystem();
  const unit = await h.unitAt(sys, "revealed", [h.digestOf("good"), h.digestOf("good"), h.digestOf("bad")]);
  const [v1, v2, v3] = sys.verifiers;
  await verdict(sys, unit.unitId, COLLUDED, [v2, v3]);
  return { sys, ...unit, honest: v1, colluders: [v2, v3] };
}

/** An honest verdict by verifiers 1 and 2; verifier 3 was lazy and signed accept-all. */
async function honestVerdictFixture() {
  const sys = await appealsSystem();
  const unit = await h.unitAt(sys, "revealed", [h.digestOf("good"), h.digestOf("good"), h.digestOf("bad")]);
  const [v1, v2, v3] = sys.verifiers;
  await verdict(sys, unit.unitId, TRUTH, [v1, v2]);
  return { sys, ...unit, lazy: v3 };
}

async function signVote(appeals, referee, unitId, outcomes, opts = {}) {
  const { chainId } = await ethers.provider.getNetwork();
  const domain = { name: "Veritrain VerdictAppeals", version: "1", chainId, verifyingContract: await appeals.getAddress() };
  const types = { RefereeVote: h.TYPES.Verdict };
  const deadline = opts.deadline ?? (await h.farDeadline());
  const signature = await (opts.signer ?? referee).signTypedData(domain, types,
    { unitId, outcomesHash: h.outcomesHashOf(outcomes), deadline });
  return { referee: referee.address, deadline, signature };
}

/** Files an appeal by `appellant` and draws its panel; returns the panel as signers. */
async function appealAndDraw(sys, unitId, appellant) {
  await sys.appeals.connect(appellant).appeal(unitId);
  await sys.appeals.drawPanel(unitId);
  const panel = (await sys.appeals.getAppeal(unitId)).panel;
  const all = [...sys.referees, ...sys.spare];
  return panel.map((address) => all.find((s) => s.address === address));
}

async function bonded(sys, account) {
  return (await sys.stakes.stakeOf(account.address))[0];
}

describe("VerdictAppeals: a colluding verifier majority", function () {
  it("no longer gets the honest minority slashed: JobMarket has no direct slash, and no truth is fixed yet",
    async function () {
      const { sys, unitId, honest } = await loadFixture(colludedFixture);
      expect(sys.market.interface.getFunction("slashContradictingVerifier")).to.equal(null);
      const evidence = await h.signVerdict(sys.market, honest, unitId, TRUTH);
      await expect(sys.appeals.slashContradiction(unitId, TRUTH, evidence))
        .to.be.revertedWithCustomError(sys.appeals, "TruthNotFixed").withArgs(unitId);
      expect(await bonded(sys, honest)).to.equal(STAKE);
    });

  it("loses on appeal: the panel overturns, the accepted cheat and both colluders are slashed, the appellant's bond returns",
    async function () {
      const { sys, unitId, honest, colluders, providers } = await loadFixture(colludedFixture);
      const cheat = providers[2];
      const cheatBefore = await bonded(sys, cheat);
      await expect(sys.appeals.connect(honest).appeal(unitId)).to.emit(sys.appeals, "AppealFiled");
      expect((await sys.stakes.stakeOf(honest.address))[1]).to.equal(APPEAL_PARAMS.appealBond);
      await expect(sys.appeals.drawPanel(unitId)).to.emit(sys.appeals, "PanelDrawn");
      const view = await sys.appeals.getAppeal(unitId);
      expect(view.panel.length).to.equal(3);
      const panel = view.panel.map((a) => sys.referees.find((r) => r.address === a));
      expect(panel.every(Boolean)).to.equal(true); // only pool members, none of the unit's parties

      await sys.appeals.vote(unitId, TRUTH, await signVote(sys.appeals, panel[0], unitId, TRUTH));
      await sys.appeals.vote(unitId, COLLUDED, await signVote(sys.appeals, panel[1], unitId, COLLUDED));
      await expect(sys.appeals.vote(unitId, TRUTH, await signVote(sys.appeals, panel[2], unitId, TRUTH)))
        .to.emit(sys.appeals, "AppealDecided").withArgs(unitId, TRUTH, h.outcomesHashOf(TRUTH), true);

      const buyerBefore = await sys.token.balanceOf(sys.buyer.address);
      const refBefore = await sys.token.balanceOf(panel[0].address);
      await expect(sys.appeals.resolve(unitId, COLLUDED, TRUTH))
        .to.emit(sys.market, "ReplicaSlashed").withArgs(unitId, cheat.address, PARAMS.slashAmount)
        .and.to.emit(sys.appeals, "AppealResolved").withArgs(unitId, true, PARAMS.slashAmount);
      expect(await bonded(sys, cheat)).to.equal(cheatBefore - PARAMS.slashAmount);
      // paid by the verdict (valid 1), then its fraud counted by the decision: the streak ends
      expect(await sys.market.reputationOf(cheat.address)).to.deep.equal([1n, 0n, 1n, 0n]);
      const bounty = PARAMS.slashAmount / 2n;
      expect(await sys.token.balanceOf(panel[0].address)).to.equal(refBefore + bounty / 2n);
      expect(await sys.token.balanceOf(panel[1].address)).to.equal(1_000n * E18 - STAKE); // voted the verdict
      expect(await sys.token.balanceOf(sys.buyer.address)).to.equal(buyerBefore + PARAMS.slashAmount - bounty);
      expect(await sys.appeals.truthOf(unitId)).to.equal(h.outcomesHashOf(TRUTH));
      expect((await sys.stakes.stakeOf(honest.address))[1]).to.equal(0n);
      expect(await bonded(sys, honest)).to.equal(STAKE);

      for (const c of colluders) {
        const evidence = await h.signVerdict(sys.market, c, unitId, COLLUDED); // as relayed to submitVerdict
        await expect(sys.appeals.connect(honest).slashContradiction(unitId, COLLUDED, evidence))
          .to.emit(sys.appeals, "VerifierSlashed")
          .withArgs(unitId, c.address, APPEAL_PARAMS.verifierSlash, honest.address);
        // each colluder earned half the fee and lost the verifier slash
        expect((await sys.market.credits(c.address)) - (STAKE - (await bonded(sys, c)))).to.equal(
          FEE / 2n - APPEAL_PARAMS.verifierSlash);
      }
      const own = await h.signVerdict(sys.market, honest, unitId, TRUTH);
      await expect(sys.appeals.slashContradiction(unitId, TRUTH, own))
        .to.be.revertedWithCustomError(sys.appeals, "VerdictNotContradicted").withArgs(unitId, honest.address);
      expect(await bonded(sys, honest)).to.equal(STAKE);
      expect(await sys.token.balanceOf(await sys.appeals.getAddress())).to.equal(0n);
      await h.expectSolvent(sys);
    });
});

describe("VerdictAppeals: a verdict that spared a cheat", function () {
  it("slashes on overturn a replica the verdict only called a fault and the panel calls fraud", async function () {
    const sys = await loadFixture(appealsSystem);
    const unit = await h.unitAt(sys, "revealed", [h.digestOf("good"), h.digestOf("good"), h.digestOf("bad")]);
    const [v1, v2, v3] = sys.verifiers;
    const spared = [ACCEPT, ACCEPT, FAULT]; // unpaid, but not slashed: the colluders protect the cheat's stake
    await verdict(sys, unit.unitId, spared, [v2, v3]);
    const cheat = unit.providers[2];
    const before = await bonded(sys, cheat);
    const panel = await appealAndDraw(sys, unit.unitId, v1);
    await sys.appeals.vote(unit.unitId, TRUTH, await signVote(sys.appeals, panel[0], unit.unitId, TRUTH));
    await sys.appeals.vote(unit.unitId, TRUTH, await signVote(sys.appeals, panel[1], unit.unitId, TRUTH));
    await expect(sys.appeals.resolve(unit.unitId, spared, TRUTH))
      .to.emit(sys.market, "ReplicaSlashed").withArgs(unit.unitId, cheat.address, PARAMS.slashAmount);
    expect(await bonded(sys, cheat)).to.equal(before - PARAMS.slashAmount);
    expect(await sys.market.reputationOf(cheat.address)).to.deep.equal([0n, 1n, 1n, 0n]); // the fault, then the fraud
    await h.expectSolvent(sys);
  });
});

describe("VerdictAppeals: no appeal", function () {
  it("fixes the verdict as the truth after the appeal window, and then slashes a contradicting minority once",
    async function () {
      const { sys, unitId, orderId, lazy } = await loadFixture(honestVerdictFixture);
      const evidence = await h.signVerdict(sys.market, lazy, unitId, COLLUDED);
      const closes = (await sys.market.getUnit(unitId)).verdictDeadline + APPEAL_PARAMS.appealWindow;
      await time.increaseTo(closes);
      await expect(sys.appeals.slashContradiction(unitId, COLLUDED, evidence))
        .to.be.revertedWithCustomError(sys.appeals, "TruthNotFixed").withArgs(unitId);
      await time.increase(1n);
      await expect(sys.appeals.connect(lazy).appeal(unitId))
        .to.be.revertedWithCustomError(sys.appeals, "AppealWindowClosed").withArgs(unitId, closes);
      expect(await sys.appeals.truthOf(unitId)).to.equal(h.outcomesHashOf(TRUTH));

      const [v1] = sys.verifiers;
      const agreeing = await h.signVerdict(sys.market, v1, unitId, TRUTH);
      await expect(sys.appeals.slashContradiction(unitId, TRUTH, agreeing))
        .to.be.revertedWithCustomError(sys.appeals, "VerdictNotContradicted").withArgs(unitId, v1.address);
      const forged = await h.signVerdict(sys.market, v1, unitId, COLLUDED, { signer: lazy });
      await expect(sys.appeals.slashContradiction(unitId, COLLUDED, forged))
        .to.be.revertedWithCustomError(sys.appeals, "InvalidSigner").withArgs(v1.address, lazy.address);
      const outsider = await h.signVerdict(sys.market, sys.other, unitId, COLLUDED);
      await expect(sys.appeals.slashContradiction(unitId, COLLUDED, outsider))
        .to.be.revertedWithCustomError(sys.appeals, "NotAssignedVerifier").withArgs(unitId, sys.other.address);
      const otherDomain = await h.signVerdict(sys.market, lazy, unitId, COLLUDED, { contract: sys.appeals });
      await expect(sys.appeals.slashContradiction(unitId, COLLUDED, otherDomain))
        .to.be.revertedWithCustomError(sys.appeals, "InvalidSigner");

      const buyerBefore = await sys.token.balanceOf(sys.buyer.address);
      const reporterBefore = await sys.token.balanceOf(sys.other.address);
      await expect(sys.appeals.connect(sys.other).slashContradiction(unitId, COLLUDED, evidence))
        .to.emit(sys.appeals, "VerifierSlashed")
        .withArgs(unitId, lazy.address, APPEAL_PARAMS.verifierSlash, sys.other.address);
      const bounty = APPEAL_PARAMS.verifierSlash / 2n;
      expect(await sys.token.balanceOf(sys.other.address)).to.equal(reporterBefore + bounty);
      expect(await sys.token.balanceOf(sys.buyer.address)).to.equal(buyerBefore + APPEAL_PARAMS.verifierSlash - bounty);
      expect((await sys.market.getOrder(orderId)).buyer).to.equal(sys.buyer.address);
      await expect(sys.appeals.slashContradiction(unitId, COLLUDED, evidence))
        .to.be.revertedWithCustomError(sys.appeals, "VerifierAlreadySlashed").withArgs(unitId, lazy.address);
      await h.expectSolvent(sys);
    });

  it("refuses an appeal of a unit that was not settled by a verdict", async function () {
    const sys = await appealsSystem();
    const { unitId } = await h.unitAt(sys, "revealed");
    await expect(sys.appeals.appeal(unitId)).to.be.revertedWithCustomError(sys.appeals, "NoVerdict").withArgs(unitId);
    await sys.market.connect(sys.operator).finalize(unitId);
    await expect(sys.appeals.appeal(unitId)).to.be.revertedWithCustomError(sys.appeals, "NoVerdict").withArgs(unitId);
    await expect(sys.appeals.truthOf(unitId)).to.be.revertedWithCustomError(sys.appeals, "NoVerdict");
  });
});

describe("VerdictAppeals: a griefing appellant", function () {
  it("loses its bond to the referees who confirmed the verdict, and its contradiction is slashed too",
    async function () {
      const { sys, unitId, lazy } = await loadFixture(honestVerdictFixture);
      const panel = await appealAndDraw(sys, unitId, lazy);
      const before = await Promise.all(panel.map((r) => sys.token.balanceOf(r.address)));
      await sys.appeals.vote(unitId, TRUTH, await signVote(sys.appeals, panel[0], unitId, TRUTH));
      await expect(sys.appeals.vote(unitId, TRUTH, await signVote(sys.appeals, panel[1], unitId, TRUTH)))
        .to.emit(sys.appeals, "AppealDecided").withArgs(unitId, TRUTH, h.outcomesHashOf(TRUTH), false);
      await expect(sys.appeals.vote(unitId, TRUTH, await signVote(sys.appeals, panel[2], unitId, TRUTH)))
        .to.be.revertedWithCustomError(sys.appeals, "AlreadyDecided").withArgs(unitId);
      await expect(sys.appeals.resolve(unitId, TRUTH, COLLUDED))
        .to.be.revertedWithCustomError(sys.appeals, "OutcomesMismatch");
      await expect(sys.appeals.resolve(unitId, TRUTH, TRUTH))
        .to.emit(sys.appeals, "AppealResolved").withArgs(unitId, false, APPEAL_PARAMS.appealBond);
      expect(await bonded(sys, lazy)).to.equal(STAKE - APPEAL_PARAMS.appealBond);
      expect((await sys.stakes.stakeOf(lazy.address))[1]).to.equal(0n);
      const share = APPEAL_PARAMS.appealBond / 2n;
      expect(await sys.token.balanceOf(panel[0].address)).to.equal(before[0] + share);
      expect(await sys.token.balanceOf(panel[1].address)).to.equal(before[1] + share);
      expect(await sys.token.balanceOf(panel[2].address)).to.equal(before[2]); // did not vote in time
      expect((await sys.appeals.getAppeal(unitId)).state).to.equal(APPEAL_STATE.Confirmed);
      await expect(sys.appeals.resolve(unitId, TRUTH, TRUTH))
        .to.be.revertedWithCustomError(sys.appeals, "NoPendingAppeal").withArgs(unitId);

      const evidence = await h.signVerdict(sys.market, lazy, unitId, COLLUDED);
      await expect(sys.appeals.slashContradiction(unitId, COLLUDED, evidence))
        .to.emit(sys.appeals, "VerifierSlashed");
      expect(await bonded(sys, lazy)).to.equal(STAKE - APPEAL_PARAMS.appealBond - APPEAL_PARAMS.verifierSlash);
      await h.expectSolvent(sys);
    });

  it("cannot appeal twice, nor without free stake for the bond", async function () {
    const { sys, unitId, lazy } = await loadFixture(honestVerdictFixture);
    const [poor] = sys.spare;
    await expect(sys.appeals.connect(poor).appeal(unitId))
      .to.be.revertedWithCustomError(sys.stakes, "InsufficientFreeStake");
    await sys.appeals.connect(lazy).appeal(unitId);
    await expect(sys.appeals.connect(sys.other).appeal(unitId))
      .to.be.revertedWithCustomError(sys.appeals, "AlreadyAppealed").withArgs(unitId);
  });
});

describe("VerdictAppeals: a panel that misses its deadline", function () {
  it("lapses: the bond returns, no truth is fixed, and nobody can be slashed for the unit", async function () {
    const { sys, unitId, honest, colluders } = await loadFixture(colludedFixture);
    const panel = await appealAndDraw(sys, unitId, honest);
    await sys.appeals.vote(unitId, TRUTH, await signVote(sys.appeals, panel[0], unitId, TRUTH));
    const { voteDeadline } = await sys.appeals.getAppeal(unitId);
    await expect(sys.appeals.lapse(unitId))
      .to.be.revertedWithCustomError(sys.appeals, "AppealNotLapsed").withArgs(unitId, voteDeadline);
    await time.increaseTo(voteDeadline + 1n);
    await expect(sys.appeals.vote(unitId, TRUTH, await signVote(sys.appeals, panel[1], unitId, TRUTH)))
      .to.be.revertedWithCustomError(sys.appeals, "VoteWindowClosed").withArgs(unitId, voteDeadline);
    await expect(sys.appeals.resolve(unitId, COLLUDED, TRUTH))
      .to.be.revertedWithCustomError(sys.appeals, "NotDecided").withArgs(unitId);
    await expect(sys.appeals.lapse(unitId)).to.emit(sys.appeals, "AppealLapsedEvent").withArgs(unitId);
    expect((await sys.stakes.stakeOf(honest.address))[1]).to.equal(0n);
    expect(await bonded(sys, honest)).to.equal(STAKE);
    await expect(sys.appeals.truthOf(unitId)).to.be.revertedWithCustomError(sys.appeals, "AppealLapsed");
    for (const v of [honest, ...colluders]) {
      const outcomes = v === honest ? TRUTH : COLLUDED;
      const evidence = await h.signVerdict(sys.market, v, unitId, outcomes);
      await expect(sys.appeals.slashContradiction(unitId, outcomes, evidence))
        .to.be.revertedWithCustomError(sys.appeals, "AppealLapsed").withArgs(unitId);
    }
    await expect(sys.appeals.lapse(unitId)).to.be.revertedWithCustomError(sys.appeals, "NoPendingAppeal");
  });
});

describe("VerdictAppeals: votes and replays", function () {
  it("takes one valid vote per seated referee, signed for this appeal in this contract's domain", async function () {
    const { sys, unitId, honest } = await loadFixture(colludedFixture);
    await sys.appeals.connect(honest).appeal(unitId);
    const early = await signVote(sys.appeals, sys.referees[0], unitId, TRUTH);
    await expect(sys.appeals.vote(unitId, TRUTH, early))
      .to.be.revertedWithCustomError(sys.appeals, "PanelNotDrawn").withArgs(unitId);
    await sys.appeals.drawPanel(unitId);
    await expect(sys.appeals.drawPanel(unitId))
      .to.be.revertedWithCustomError(sys.appeals, "PanelAlreadyDrawn").withArgs(unitId);
    const { panel: seated } = await sys.appeals.getAppeal(unitId);
    const [r0, r1] = seated.map((a) => sys.referees.find((r) => r.address === a));
    const outsider = sys.referees.find((r) => !seated.includes(r.address));
    await expect(sys.appeals.vote(unitId, TRUTH, await signVote(sys.appeals, outsider, unitId, TRUTH)))
      .to.be.revertedWithCustomError(sys.appeals, "NotOnPanel").withArgs(unitId, outsider.address);
    await expect(sys.appeals.vote(unitId, [ACCEPT, ACCEPT], await signVote(sys.appeals, r0, unitId, [ACCEPT, ACCEPT])))
      .to.be.revertedWithCustomError(sys.appeals, "OutcomeCountMismatch").withArgs(3n, 2n);
    await expect(sys.appeals.vote(unitId, [ACCEPT, ACCEPT, 3], await signVote(sys.appeals, r0, unitId, [ACCEPT, ACCEPT, 3])))
      .to.be.revertedWithCustomError(sys.appeals, "InvalidOutcome").withArgs(2n, 3n);
    // a vote for another unit, a JobMarket Verdict signature, someone else's key, an expired signature
    const otherUnit = await signVote(sys.appeals, r0, unitId + 1n, TRUTH);
    await expect(sys.appeals.vote(unitId, TRUTH, otherUnit)).to.be.revertedWithCustomError(sys.appeals, "InvalidSigner");
    const marketSig = await h.signVerdict(sys.market, r0, unitId, TRUTH);
    await expect(sys.appeals.vote(unitId, TRUTH, { referee: r0.address, deadline: marketSig.deadline, signature: marketSig.signature }))
      .to.be.revertedWithCustomError(sys.appeals, "InvalidSigner");
    await expect(sys.appeals.vote(unitId, TRUTH, await signVote(sys.appeals, r0, unitId, TRUTH, { signer: r1 })))
      .to.be.revertedWithCustomError(sys.appeals, "InvalidSigner").withArgs(r0.address, r1.address);
    const stale = await signVote(sys.appeals, r0, unitId, TRUTH, { deadline: BigInt(await time.latest()) - 1n });
    await expect(sys.appeals.vote(unitId, TRUTH, stale)).to.be.revertedWithCustomError(sys.appeals, "SignatureExpired");

    const vote = await signVote(sys.appeals, r0, unitId, TRUTH);
    await expect(sys.appeals.vote(unitId, TRUTH, vote)).to.emit(sys.appeals, "RefereeVoted")
      .withArgs(unitId, r0.address, h.outcomesHashOf(TRUTH));
    await expect(sys.appeals.vote(unitId, TRUTH, vote))
      .to.be.revertedWithCustomError(sys.appeals, "AlreadyVoted").withArgs(unitId, r0.address);
    const changed = await signVote(sys.appeals, r0, unitId, COLLUDED);
    await expect(sys.appeals.vote(unitId, COLLUDED, changed))
      .to.be.revertedWithCustomError(sys.appeals, "AlreadyVoted").withArgs(unitId, r0.address);
  });
});

describe("VerdictAppeals: the panel draw", function () {
  it("never seats the unit's providers, its verifiers or the appellant, even when they are in the pool",
    async function () {
      const { sys, unitId, honest, providers } = await loadFixture(colludedFixture);
      const parties = [...providers, ...sys.verifiers];
      for (const p of parties) await sys.appeals.connect(p).joinPool();
      await sys.appeals.connect(honest).appeal(unitId);
      await sys.appeals.drawPanel(unitId);
      const { panel } = await sys.appeals.getAppeal(unitId);
      for (const p of parties) expect(panel).to.not.include(p.address);
      expect(new Set(panel).size).to.equal(3);
    });

  it("draws only from the pool as it was at the appeal: later joins are never seated, earlier leavers neither",
    async function () {
      const { sys, unitId, honest } = await loadFixture(colludedFixture);
      await sys.appeals.connect(sys.referees[0]).leavePool();
      await sys.appeals.connect(sys.referees[1]).leavePool();
      await sys.appeals.connect(honest).appeal(unitId);
      for (const s of sys.spare) {
        await sys.token.mint(s.address, 1_000n * E18);
        await sys.token.connect(s).approve(await sys.stakes.getAddress(), ethers.MaxUint256);
        await sys.stakes.connect(s).stake(STAKE);
        await sys.appeals.connect(s).joinPool();
      }
      expect((await sys.appeals.getAppeal(unitId)).poolSize).to.equal(5n);
      await sys.appeals.drawPanel(unitId);
      const { panel } = await sys.appeals.getAppeal(unitId);
      expect([...panel].sort()).to.deep.equal(sys.referees.slice(2).map((r) => r.address).sort());
    });

  it("refuses to seat a panel the pool cannot fill, and then lapses", async function () {
    const { sys, unitId, honest } = await loadFixture(colludedFixture);
    await sys.appeals.connect(sys.referees[0]).leavePool();
    await sys.appeals.connect(sys.referees[1]).leavePool();
    await sys.appeals.connect(sys.referees[2]).leavePool();
    await sys.appeals.connect(honest).appeal(unitId);
    await expect(sys.appeals.drawPanel(unitId)).to.be.revertedWithCustomError(sys.appeals, "PanelUndrawable");
    await time.increaseTo((await sys.appeals.getAppeal(unitId)).voteDeadline + 1n);
    await expect(sys.appeals.drawPanel(unitId)).to.be.revertedWithCustomError(sys.appeals, "VoteWindowClosed");
    await sys.appeals.lapse(unitId);
    expect(await bonded(sys, honest)).to.equal(STAKE);
  });

  it("is drawn from a block after the appeal, and re-seeded when that block's hash expired", async function () {
    const { sys, unitId, honest } = await loadFixture(colludedFixture);
    await network.provider.send("evm_setAutomine", [false]);
    try {
      await sys.appeals.connect(honest).appeal(unitId, { gasLimit: 500_000 });
      const early = await sys.appeals.drawPanel(unitId, { gasLimit: 1_000_000 });
      await network.provider.send("evm_mine", []);
      const receipt = await ethers.provider.getTransactionReceipt(early.hash);
      expect(receipt.status).to.equal(0); // DrawTooEarly: the seed block's hash is not readable inside it
    } finally {
      await network.provider.send("evm_setAutomine", [true]);
    }
    const { seedBlock, state } = await sys.appeals.getAppeal(unitId);
    expect(state).to.equal(APPEAL_STATE.Pending);
    await network.provider.send("hardhat_mine", ["0x101"]);
    const reseed = await sys.appeals.drawPanel(unitId);
    const reseededAt = BigInt((await reseed.wait()).blockNumber);
    await expect(reseed).to.emit(sys.appeals, "AppealReseeded").withArgs(unitId, reseededAt);
    const after = await sys.appeals.getAppeal(unitId);
    expect(after.seedBlock).to.equal(reseededAt);
    expect(after.seedBlock).to.be.greaterThan(seedBlock);
    expect(after.panel.length).to.equal(0);
    await expect(sys.appeals.drawPanel(unitId)).to.emit(sys.appeals, "PanelDrawn");
  });
});

describe("VerdictAppeals: referee pool and parameters", function () {
  it("locks the referee stake while in the pool and releases it on leaving", async function () {
    const sys = await loadFixture(appealsSystem);
    const [r] = sys.referees;
    expect(await sys.appeals.inPool(r.address)).to.equal(true);
    expect((await sys.stakes.stakeOf(r.address))[1]).to.equal(APPEAL_PARAMS.refereeStake);
    await expect(sys.appeals.connect(r).joinPool())
      .to.be.revertedWithCustomError(sys.appeals, "AlreadyInPool").withArgs(r.address);
    await expect(sys.appeals.connect(r).leavePool()).to.emit(sys.appeals, "RefereeLeft").withArgs(r.address, 0n);
    expect((await sys.stakes.stakeOf(r.address))[1]).to.equal(0n);
    await expect(sys.appeals.connect(r).leavePool())
      .to.be.revertedWithCustomError(sys.appeals, "NotInPool").withArgs(r.address);
    await expect(sys.appeals.connect(sys.spare[0]).joinPool())
      .to.be.revertedWithCustomError(sys.stakes, "InsufficientFreeStake");
    await sys.appeals.connect(r).joinPool();
    expect(await sys.appeals.poolLength()).to.equal(6n);
  });

  it("refuses unusable parameters, and a decision that could outlast the unbonding period", async function () {
    const sys = await loadFixture(appealsSystem);
    const market = await sys.market.getAddress();
    const factory = await ethers.getContractFactory("VerdictAppeals");
    const bad = async (patch, name) => {
      await expect(factory.deploy(market, { ...APPEAL_PARAMS, ...patch }))
        .to.be.revertedWithCustomError(factory, "InvalidParameter").withArgs(name);
    };
    await bad({ appealWindow: 0n }, "appealWindow");
    await bad({ voteWindow: 0n }, "voteWindow");
    await bad({ panelSize: 2 }, "panelSize");
    await bad({ panelSize: 9 }, "panelSize");
    await bad({ bountyBps: 10_001 }, "bountyBps");
    await bad({ refereeStake: 0n }, "refereeStake");
    // A verdict can land right after assignment; its appeal window runs from the verdict deadline, which
    // is fixed at assignment: every window counts.
    const marketWindows = PARAMS.commitWindow + PARAMS.revealWindow + PARAMS.verdictWindow;
    await bad({ voteWindow: h.UNBONDING - marketWindows - APPEAL_PARAMS.appealWindow }, "unbondingPeriod");
    await factory.deploy(market, { ...APPEAL_PARAMS, voteWindow: h.UNBONDING - marketWindows - APPEAL_PARAMS.appealWindow - 1n });
    const p = await sys.appeals.params();
    expect(p.panelSize).to.equal(3n);
    expect(p.verifierSlash).to.equal(APPEAL_PARAMS.verifierSlash);
    expect(await sys.appeals.market()).to.equal(market);
  });
});

/** `[bonded, locked]` of `account`. */
async function stakeOf(sys, account) {
  const [b, locked] = await sys.stakes.stakeOf(account.address);
  return [b, locked];
}

/** Market token balance == escrow + credits, and the appeals contract holds nothing. */
async function expectConserved(sys) {
  const owed = (await sys.market.totalEscrow()) + (await sys.market.totalCredits());
  expect(await sys.token.balanceOf(await sys.market.getAddress())).to.equal(owed);
  expect(await sys.token.balanceOf(await sys.appeals.getAddress())).to.equal(0n);
  await h.expectSolvent(sys);
}

/** The time a unit's verdict was recorded, from its hold ({JobMarket-heldOf}). */
async function heldSince(sys, unitId) {
  return (await sys.market.heldOf(unitId))[1];
}

const BOUNTY = (PARAMS.slashAmount * BigInt(APPEAL_PARAMS.bountyBps)) / 10_000n; // JobMarket's bountyBps is the same

describe("VerdictAppeals: a majority that frames an honest replica (truth before money)", function () {
  const FRAMED = [FRAUD, ACCEPT, ACCEPT]; // replica 1 is honest: every replica returned the same result
  const ALL_GOOD = [ACCEPT, ACCEPT, ACCEPT];

  it("holds the framed replica at the verdict, and after the overturn pays it with its stake intact; the colluders get no bounty and are slashed",
    async function () {
      const sys = await loadFixture(appealsSystem);
      const unit = await h.unitAt(sys, "revealed"); // unanimous, drawn for a spot check
      const { unitId, orderId, providers } = unit;
      await sys.market.connect(sys.operator).requestVerification(unitId);
      const [honest, c1, c2] = sys.verifiers;
      const framed = providers[0];
      const orderBalance = (await sys.market.getOrder(orderId)).balance;

      const tx = verdict(sys, unitId, FRAMED, [c1, c2]);
      await expect(tx).to.emit(sys.market, "FraudHeld").withArgs(unitId, 1);
      await expect(tx).to.not.emit(sys.market, "ReplicaSlashed");
      expect(await stakeOf(sys, framed)).to.deep.equal([STAKE, PARAMS.providerCollateral]); // locked, not slashed
      expect(await sys.market.credits(framed.address)).to.equal(0n);
      for (const c of [c1, c2]) expect(await sys.market.credits(c.address)).to.equal(FEE / 2n); // the fee only
      expect((await sys.market.getOrder(orderId)).balance).to.equal(orderBalance); // its price stays escrowed
      await expectConserved(sys);

      const panel = await appealAndDraw(sys, unitId, honest);
      await sys.appeals.vote(unitId, ALL_GOOD, await signVote(sys.appeals, panel[0], unitId, ALL_GOOD));
      await expect(sys.appeals.vote(unitId, ALL_GOOD, await signVote(sys.appeals, panel[1], unitId, ALL_GOOD)))
        .to.emit(sys.appeals, "AppealDecided").withArgs(unitId, ALL_GOOD, h.outcomesHashOf(ALL_GOOD), true);
      expect((await sys.market.reputationOf(framed.address)).fraud).to.equal(1n); // accused, while held
      const resolved = sys.appeals.resolve(unitId, FRAMED, ALL_GOOD);
      await expect(resolved).to.emit(sys.market, "HeldSettled").withArgs(unitId, ALL_GOOD);
      await expect(resolved).to.not.emit(sys.market, "ReplicaSlashed");
      await expect(resolved).to.emit(sys.appeals, "AppealResolved").withArgs(unitId, true, 0n);

      expect(await sys.market.credits(framed.address)).to.equal(PRICE);
      expect(await stakeOf(sys, framed)).to.deep.equal([STAKE, 0n]);
      expect(await sys.market.reputationOf(framed.address)).to.deep.equal([1n, 0n, 0n, 1n]);
      for (const c of [c1, c2]) expect(await sys.market.credits(c.address)).to.equal(FEE / 2n); // no bounty
      expect(await sys.market.credits(sys.buyer.address)).to.equal(FEE - 2n * (FEE / 2n));
      expect(await sys.market.heldOf(unitId)).to.deep.equal([0n, 0n]);
      expect(await stakeOf(sys, honest)).to.deep.equal([STAKE, 0n]); // the bond returned
      for (const c of [c1, c2]) {
        const evidence = await h.signVerdict(sys.market, c, unitId, FRAMED);
        await expect(sys.appeals.connect(honest).slashContradiction(unitId, FRAMED, evidence))
          .to.emit(sys.appeals, "VerifierSlashed").withArgs(unitId, c.address, APPEAL_PARAMS.verifierSlash, honest.address);
        expect(await bonded(sys, c)).to.equal(STAKE - APPEAL_PARAMS.verifierSlash);
      }
      await expect(sys.appeals.settleVerdict(unitId, FRAMED)).to.not.emit(sys.market, "HeldSettled");
      await expectConserved(sys);
    });

  it("overturned with the truth keeping fraud for a held cheat: the cheat is slashed with the bounty to the deciding referees, not the verdict's signers",
    async function () {
      const sys = await loadFixture(appealsSystem);
      const { unitId, providers } = await h.unitAt(sys, "revealed",
        [h.digestOf("good"), h.digestOf("good"), h.digestOf("bad")]);
      const framedToo = [FRAUD, ACCEPT, FRAUD]; // right about replica 3, framing replica 1
      const [honest, c1, c2] = sys.verifiers;
      const [framed, , cheat] = providers;
      await expect(verdict(sys, unitId, framedToo, [c1, c2])).to.emit(sys.market, "FraudHeld").withArgs(unitId, 0b101);
      const panel = await appealAndDraw(sys, unitId, honest);
      await sys.appeals.vote(unitId, TRUTH, await signVote(sys.appeals, panel[0], unitId, TRUTH));
      await sys.appeals.vote(unitId, TRUTH, await signVote(sys.appeals, panel[1], unitId, TRUTH));
      const before = await Promise.all(panel.map((r) => sys.token.balanceOf(r.address)));
      const buyerBefore = await sys.token.balanceOf(sys.buyer.address);

      const tx = sys.appeals.resolve(unitId, framedToo, TRUTH);
      await expect(tx).to.emit(sys.market, "ReplicaSlashed").withArgs(unitId, cheat.address, PARAMS.slashAmount);
      await expect(tx).to.emit(sys.market, "HeldSettled").withArgs(unitId, TRUTH);
      const slashes = (await (await tx).wait()).logs.filter((l) => sys.market.interface.parseLog(l)?.name === "ReplicaSlashed");
      expect(slashes.length).to.equal(1); // the verdict already called it fraud: slashed once
      await expect(tx).to.emit(sys.appeals, "AppealResolved").withArgs(unitId, true, PARAMS.slashAmount);
      const bounty = (PARAMS.slashAmount * BigInt(APPEAL_PARAMS.bountyBps)) / 10_000n;
      expect(await sys.token.balanceOf(panel[0].address)).to.equal(before[0] + bounty / 2n);
      expect(await sys.token.balanceOf(panel[1].address)).to.equal(before[1] + bounty / 2n);
      expect(await sys.token.balanceOf(panel[2].address)).to.equal(before[2]);
      expect(await sys.token.balanceOf(sys.buyer.address)).to.equal(buyerBefore + PARAMS.slashAmount - bounty);
      for (const c of [c1, c2]) expect(await sys.market.credits(c.address)).to.equal(FEE / 2n); // no bounty
      expect(await sys.market.credits(honest.address)).to.equal(0n); // did not sign the verdict
      expect(await stakeOf(sys, cheat)).to.deep.equal([STAKE - PARAMS.slashAmount, 0n]);
      expect(await sys.market.reputationOf(cheat.address)).to.deep.equal([0n, 0n, 1n, 0n]);
      expect(await sys.market.credits(framed.address)).to.equal(PRICE);
      expect(await stakeOf(sys, framed)).to.deep.equal([STAKE, 0n]);
      expect(await sys.market.credits(sys.buyer.address)).to.equal(PRICE); // the cheat's unpaid price
      await expectConserved(sys);
    });
});

describe("VerdictAppeals: settling held fraud by the verdict (settleVerdict)", function () {
  it("unappealed: TruthNotFixed until the appeal window after the verdict closed, then slashes the held replica: bounty to the verdict's signers only, the rest and its price to the buyer; once",
    async function () {
      const { sys, unitId, providers, lazy } = await loadFixture(honestVerdictFixture);
      const [v1, v2] = sys.verifiers;
      const cheat = providers[2];
      const since = await heldSince(sys, unitId);
      expect(since).to.be.greaterThan(0n);
      await expect(sys.appeals.settleVerdict(unitId, TRUTH))
        .to.be.revertedWithCustomError(sys.appeals, "TruthNotFixed").withArgs(unitId);
      await time.setNextBlockTimestamp(since + APPEAL_PARAMS.appealWindow);
      await expect(sys.appeals.settleVerdict(unitId, TRUTH))
        .to.be.revertedWithCustomError(sys.appeals, "TruthNotFixed").withArgs(unitId);
      expect(await stakeOf(sys, cheat)).to.deep.equal([STAKE, PARAMS.providerCollateral]);
      expect(await sys.market.credits(sys.buyer.address)).to.equal(0n);

      await time.setNextBlockTimestamp(since + APPEAL_PARAMS.appealWindow + 1n);
      const tx = sys.appeals.connect(sys.other).settleVerdict(unitId, TRUTH);
      await expect(tx).to.emit(sys.market, "ReplicaSlashed").withArgs(unitId, cheat.address, PARAMS.slashAmount);
      await expect(tx).to.emit(sys.market, "HeldSettled").withArgs(unitId, TRUTH);
      for (const v of [v1, v2]) expect(await sys.market.credits(v.address)).to.equal(FEE / 2n + BOUNTY / 2n);
      expect(await sys.market.credits(lazy.address)).to.equal(0n);
      expect(await sys.market.credits(sys.other.address)).to.equal(0n);
      expect(await sys.market.credits(sys.buyer.address)).to.equal(PARAMS.slashAmount - BOUNTY + PRICE);
      expect(await stakeOf(sys, cheat)).to.deep.equal([STAKE - PARAMS.slashAmount, 0n]);
      expect(await sys.market.reputationOf(cheat.address)).to.deep.equal([0n, 0n, 1n, 0n]);
      await expectConserved(sys);

      await expect(sys.appeals.settleVerdict(unitId, TRUTH)).to.not.emit(sys.market, "HeldSettled");
      expect(await sys.market.credits(sys.buyer.address)).to.equal(PARAMS.slashAmount - BOUNTY + PRICE);
      expect(await bonded(sys, cheat)).to.equal(STAKE - PARAMS.slashAmount);
    });

  it("a confirmed fraud also ends the streak the accused built while its verdict was open to appeal",
    async function () {
      const { sys, unitId, providers } = await loadFixture(honestVerdictFixture);
      const cheat = providers[2];
      expect(await sys.market.reputationOf(cheat.address)).to.deep.equal([0n, 0n, 1n, 0n]); // accused: streak 0
      const later = await h.unitAt(sys, "revealed"); // the same providers, every replica right
      await verdict(sys, later.unitId, COLLUDED, sys.verifiers.slice(0, 2));
      expect(await sys.market.reputationOf(cheat.address)).to.deep.equal([1n, 0n, 1n, 1n]);
      await time.increaseTo((await heldSince(sys, unitId)) + APPEAL_PARAMS.appealWindow + 1n);
      await expect(sys.appeals.settleVerdict(unitId, TRUTH)).to.emit(sys.market, "HeldSettled");
      expect(await sys.market.reputationOf(cheat.address)).to.deep.equal([1n, 0n, 1n, 0n]);
    });

  it("pending appeal: TruthNotFixed even past the window; lapsed appeal: settles by the verdict (bounty to its signers)",
    async function () {
      const { sys, unitId, providers, lazy } = await loadFixture(honestVerdictFixture);
      const [v1, v2] = sys.verifiers;
      await appealAndDraw(sys, unitId, lazy);
      await time.increaseTo((await heldSince(sys, unitId)) + APPEAL_PARAMS.appealWindow + 1n);
      await expect(sys.appeals.settleVerdict(unitId, TRUTH))
        .to.be.revertedWithCustomError(sys.appeals, "TruthNotFixed").withArgs(unitId);
      await time.increaseTo((await sys.appeals.getAppeal(unitId)).voteDeadline + 1n);
      await expect(sys.appeals.settleVerdict(unitId, TRUTH))
        .to.be.revertedWithCustomError(sys.appeals, "TruthNotFixed").withArgs(unitId);
      await sys.appeals.lapse(unitId);
      const tx = sys.appeals.settleVerdict(unitId, TRUTH);
      await expect(tx).to.emit(sys.market, "ReplicaSlashed").withArgs(unitId, providers[2].address, PARAMS.slashAmount);
      await expect(tx).to.emit(sys.market, "HeldSettled").withArgs(unitId, TRUTH);
      for (const v of [v1, v2]) expect(await sys.market.credits(v.address)).to.equal(FEE / 2n + BOUNTY / 2n);
      expect(await sys.market.credits(lazy.address)).to.equal(0n);
      expect(await sys.market.credits(sys.buyer.address)).to.equal(PARAMS.slashAmount - BOUNTY + PRICE);
      await expectConserved(sys);
    });

  it("confirmed appeal: resolve settles the held fraud by the verdict (bounty to its signers); a later settleVerdict is a no-op",
    async function () {
      const { sys, unitId, providers, lazy } = await loadFixture(honestVerdictFixture);
      const [v1, v2] = sys.verifiers;
      const cheat = providers[2];
      const panel = await appealAndDraw(sys, unitId, lazy);
      await sys.appeals.vote(unitId, TRUTH, await signVote(sys.appeals, panel[0], unitId, TRUTH));
      await sys.appeals.vote(unitId, TRUTH, await signVote(sys.appeals, panel[1], unitId, TRUTH));
      const tx = sys.appeals.resolve(unitId, TRUTH, TRUTH);
      await expect(tx).to.emit(sys.market, "ReplicaSlashed").withArgs(unitId, cheat.address, PARAMS.slashAmount);
      await expect(tx).to.emit(sys.market, "HeldSettled").withArgs(unitId, TRUTH);
      await expect(tx).to.emit(sys.appeals, "AppealResolved").withArgs(unitId, false, APPEAL_PARAMS.appealBond);
      for (const v of [v1, v2]) expect(await sys.market.credits(v.address)).to.equal(FEE / 2n + BOUNTY / 2n);
      for (const r of panel) expect(await sys.market.credits(r.address)).to.equal(0n); // referees get the bond only
      expect(await sys.market.credits(lazy.address)).to.equal(0n);
      expect(await sys.market.credits(sys.buyer.address)).to.equal(PARAMS.slashAmount - BOUNTY + PRICE);
      expect(await stakeOf(sys, cheat)).to.deep.equal([STAKE - PARAMS.slashAmount, 0n]);
      await expectConserved(sys);
      await time.increaseTo((await sys.market.getUnit(unitId)).verdictDeadline + APPEAL_PARAMS.appealWindow + 1n);
      await expect(sys.appeals.settleVerdict(unitId, TRUTH)).to.not.emit(sys.market, "HeldSettled");
      expect(await stakeOf(sys, cheat)).to.deep.equal([STAKE - PARAMS.slashAmount, 0n]);
      expect(await sys.market.credits(sys.buyer.address)).to.equal(PARAMS.slashAmount - BOUNTY + PRICE);
    });

  it("refuses outcomes that are not the verdict (OutcomesMismatch), and JobMarket.settleHeld refuses any caller without APPEALS_ROLE",
    async function () {
      const { sys, unitId, lazy } = await loadFixture(honestVerdictFixture);
      await time.increaseTo((await heldSince(sys, unitId)) + APPEAL_PARAMS.appealWindow + 1n);
      await expect(sys.appeals.settleVerdict(unitId, COLLUDED)).to.be.revertedWithCustomError(sys.appeals, "OutcomesMismatch")
        .withArgs(unitId, h.outcomesHashOf(TRUTH), h.outcomesHashOf(COLLUDED));
      const role = await sys.market.APPEALS_ROLE();
      expect(await sys.market.hasRole(role, await sys.appeals.getAddress())).to.equal(true);
      for (const caller of [sys.other, sys.admin, lazy, sys.buyer]) {
        await expect(sys.market.connect(caller).settleHeld(unitId, TRUTH, COLLUDED))
          .to.be.revertedWithCustomError(sys.market, "AccessControlUnauthorizedAccount").withArgs(caller.address, role);
      }
      expect((await sys.market.heldOf(unitId))[0]).to.equal(0b100n);
    });
});

module.exports = { APPEAL_PARAMS };
