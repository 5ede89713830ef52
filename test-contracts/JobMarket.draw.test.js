// JobMarket: the on-chain spot-check draw, fixed deadlines and the withhold penalty (issue 8, findings 1 and 2).
"use strict";

const { expect } = require("chai");
const { ethers, network } = require("hardhat");
const { loadFixture, time } = require("./chain");
const h = require("./helpers");

const { E18, PARAMS, PRICE, FEE, UNIT_STATE, ACCEPT, FAULT } = h;
const PPM = 1_000_000n;
const HALF = { ...PARAMS, spotCheckPpm: 500_000, soloSpotCheckPpm: 500_000 };

async function halfFixture() {
  return h.fundedSystem(HALF);
}

/** The draw the contract must make for `unitId` with seed block `seedBlock` at rate `ppm`. */
async function expectedDraw(unitId, seedBlock, ppm) {
  const block = await ethers.provider.getBlock(seedBlock);
  const word = ethers.keccak256(ethers.AbiCoder.defaultAbiCoder().encode(["bytes32", "uint256"], [block.hash, unitId]));
  return BigInt(word) % PPM < BigInt(ppm);
}

/** Reveals a unanimous unit and settles it (by verdict when drawn), freeing its providers' collateral. */
async function settle(sys, { unitId, providers, digests }) {
  await sys.market.connect(sys.operator).revealBatch(unitId, revealsOf(unitId, providers, digests));
  if ((await sys.market.getUnit(unitId)).drawn) await verdict(sys, unitId, providers.map(() => ACCEPT));
}

/** Assigns and fully commits units until one whose draw (from its last commit's block) is `wanted`. */
async function committedUnitDrawn(sys, wanted) {
  for (let attempt = 0; attempt < 40; attempt++) {
    const unit = await h.unitAt(sys, "committed", null, { units: 1 });
    const seedBlock = await ethers.provider.getBlockNumber();
    if ((await expectedDraw(unit.unitId, seedBlock, HALF.spotCheckPpm)) === wanted) return { ...unit, seedBlock };
    await settle(sys, unit);
  }
  throw new Error("no unit with the wanted draw in 40 tries at a 50 % rate");
}

function revealsOf(unitId, providers, digests) {
  return providers.map((p, i) => ({ provider: p.address, resultDigest: digests[i], salt: h.saltOf(`${unitId}:${i}`) }));
}

async function verdict(sys, unitId, outcomes) {
  const sigs = [];
  for (const v of sys.verifiers.slice(0, 2)) sigs.push(await h.signVerdict(sys.market, v, unitId, outcomes));
  return sys.market.connect(sys.other).submitVerdict(unitId, outcomes, sigs);
}

describe("JobMarket: on-chain spot-check draw", function () {
  it("refuses reveals in the last commit's block, whose hash is the seed", async function () {
    const sys = await loadFixture(halfFixture);
    const { orderId } = await h.postOrder(sys, { units: 1 });
    const { unitId, providers } = await h.assignUnit(sys, orderId);
    const digests = providers.map(() => h.digestOf("same"));
    await h.commitAll(sys, unitId, providers.slice(0, 2), digests.slice(0, 2));
    const c3 = h.commitmentOf(digests[2], h.saltOf(`${unitId}:2`), providers[2].address, unitId);
    await network.provider.send("evm_setAutomine", [false]);
    try {
      const commitTx = await sys.market.connect(providers[2]).commit(unitId, c3);
      const revealTx = await sys.market.connect(sys.operator).revealBatch(unitId, revealsOf(unitId, providers, digests),
        { gasLimit: 1_000_000 });
      await network.provider.send("evm_mine", []);
      const seedBlock = (await commitTx.wait()).blockNumber;
      await expect(revealTx.wait()).to.be.rejected;
      await expect(sys.market.revealBatch.staticCall(unitId, revealsOf(unitId, providers, digests),
        { blockTag: seedBlock })).to.be.revertedWithCustomError(sys.market, "RevealTooEarly").withArgs(unitId, seedBlock);
    } finally {
      await network.provider.send("evm_setAutomine", [true]);
    }
    expect((await sys.market.getUnit(unitId)).revealedMask).to.equal(0n);
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, revealsOf(unitId, providers, digests))).to.emit(sys.market, "ReplicaRevealed");
  });

  it("the last revealer cannot time a drawn unit out of its draw, and finalize refuses it", async function () {
    const sys = await loadFixture(halfFixture);
    const { unitId, providers, digests } = await committedUnitDrawn(sys, true);
    // Two honest reveals right away; the last revealer waits for blocks of its liking: the draw is already fixed.
    await expect(sys.market.reveal(unitId, providers[0].address, digests[0], h.saltOf(`${unitId}:0`)))
      .to.emit(sys.market, "VerificationRequested").withArgs(unitId);
    await sys.market.reveal(unitId, providers[1].address, digests[1], h.saltOf(`${unitId}:1`));
    for (let wait = 0; wait < 5; wait++) {
      await network.provider.send("evm_mine", []);
      expect((await sys.market.getUnit(unitId)).drawn).to.equal(true);
    }
    const last = [{ provider: providers[2].address, resultDigest: digests[2], salt: h.saltOf(`${unitId}:2`) }];
    expect(await sys.market.revealBatch.staticCall(unitId, last)).to.equal(false);
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, last)).to.not.emit(sys.market, "UnitFinalized");
    await expect(sys.market.connect(sys.operator).finalize(unitId)).to.be.revertedWithCustomError(sys.market, "UnitUnderVerification")
      .withArgs(unitId);
    // earlier tries (units whose draw was not the wanted one) may already have paid these providers
    const before = await Promise.all(providers.map((p) => sys.market.credits(p.address)));
    await verdict(sys, unitId, [ACCEPT, ACCEPT, ACCEPT]);
    expect((await sys.market.getUnit(unitId)).state).to.equal(UNIT_STATE.Verdicted);
    for (const [i, p] of providers.entries()) expect(await sys.market.credits(p.address)).to.equal(before[i] + PRICE);
    await h.expectSolvent(sys);
  });

  it("an undrawn unit finalizes on the fast path, whatever block its reveals land in", async function () {
    const sys = await loadFixture(halfFixture);
    const { unitId, providers, digests } = await committedUnitDrawn(sys, false);
    await network.provider.send("hardhat_mine", ["0x7"]);
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, revealsOf(unitId, providers, digests)))
      .to.emit(sys.market, "UnitFinalized").and.not.emit(sys.market, "VerificationRequested");
  });

  it("counts the unit as drawn once its seed hash is gone (more than 256 blocks before the first reveal)",
    async function () {
      const sys = await loadFixture(halfFixture);
      const { unitId, providers, digests } = await committedUnitDrawn(sys, false);
      await network.provider.send("hardhat_mine", ["0x101"]);
      await expect(sys.market.connect(sys.operator).revealBatch(unitId, revealsOf(unitId, providers, digests)))
        .to.emit(sys.market, "VerificationRequested").withArgs(unitId).and.not.emit(sys.market, "UnitFinalized");
      await expect(sys.market.connect(sys.operator).finalize(unitId)).to.be.revertedWithCustomError(sys.market, "UnitUnderVerification");
    });

  it("draws about the configured share of units (rate 50 %, 40 units)", async function () {
    const sys = await loadFixture(halfFixture);
    let drawn = 0;
    for (let i = 0; i < 40; i++) {
      const { unitId, providers, digests } = await h.unitAt(sys, "committed", null, { units: 1 });
      const seedBlock = await ethers.provider.getBlockNumber();
      const expected = await expectedDraw(unitId, seedBlock, HALF.spotCheckPpm);
      await sys.market.connect(sys.operator).revealBatch(unitId, revealsOf(unitId, providers, digests));
      const u = await sys.market.getUnit(unitId);
      expect(u.drawn).to.equal(expected);
      expect(u.state).to.equal(expected ? UNIT_STATE.Revealing : UNIT_STATE.Finalized);
      if (expected) {
        drawn += 1;
        await verdict(sys, unitId, [ACCEPT, ACCEPT, ACCEPT]);
      }
    }
    expect(drawn).to.be.within(8, 32);
  });

  it("refuses spot-check rates above 100 % and a withhold penalty above the slash amount", async function () {
    const [admin, operator] = await ethers.getSigners();
    const token = await ethers.deployContract("VeriToken");
    const stakes = await ethers.deployContract("StakeManager", [await token.getAddress(), 3600n, admin.address]);
    const deploy = (params) => h.deployMarket(token.target, stakes.target, operator.address, { ...PARAMS, ...params });
    const market = await deploy({ spotCheckPpm: 1_000_000, soloSpotCheckPpm: 1_000_000 });
    await expect(deploy({ spotCheckPpm: 1_000_001 })).to.be.revertedWithCustomError(market, "InvalidParameter")
      .withArgs("spotCheckPpm");
    await expect(deploy({ soloSpotCheckPpm: 1_000_001 })).to.be.revertedWithCustomError(market, "InvalidParameter")
      .withArgs("spotCheckPpm");
    await expect(deploy({ withholdPenalty: PARAMS.slashAmount + 1n }))
      .to.be.revertedWithCustomError(market, "InvalidParameter").withArgs("withholdPenalty");
    const params = await market.params();
    expect([params.spotCheckPpm, params.soloSpotCheckPpm, params.withholdPenalty])
      .to.deep.equal([1_000_000n, 1_000_000n, PARAMS.withholdPenalty]);
  });
});

describe("JobMarket: probation (newcomers are always verified)", function () {
  const PROBATION = { ...PARAMS, probationStreak: 2 };

  async function probationFixture() {
    return h.fundedSystem(PROBATION);
  }

  /** A unanimous unit of `providers`, assigned, committed and revealed; returns it and its assign tx. */
  async function unanimousUnit(sys, providers) {
    const unit = await h.unitAt(sys, "committed", null, { units: 1, providers });
    await network.provider.send("evm_mine", []);
    await sys.market.connect(sys.operator).revealBatch(unit.unitId, revealsOf(unit.unitId, providers, unit.digests));
    return unit;
  }

  it("a ring of fresh keys holding every replica is drawn at assignment and settles only by verdict", async function () {
    const sys = await loadFixture(probationFixture);
    const ring = sys.providers.slice(0, 3);
    const { orderId } = await h.postOrder(sys, { units: 1 });
    const { unitId, tx } = await h.assignUnit(sys, orderId, { providers: ring });
    await expect(tx).to.emit(sys.market, "VerificationRequested").withArgs(unitId);
    expect((await sys.market.getUnit(unitId)).drawn).to.equal(true);
    const digests = ring.map(() => h.digestOf("wrong but unanimous"));
    await h.commitAll(sys, unitId, ring, digests);
    await network.provider.send("evm_mine", []);
    await expect(sys.market.connect(sys.operator).revealBatch(unitId, revealsOf(unitId, ring, digests))).to.not.emit(sys.market, "UnitFinalized");
    await expect(sys.market.connect(sys.operator).finalize(unitId)).to.be.revertedWithCustomError(sys.market, "UnitUnderVerification");
  });

  it("past the streak a unit is not drawn; one provider still on probation draws it again", async function () {
    const sys = await loadFixture(probationFixture);
    const [a, b, c, newcomer] = sys.providers;
    for (let i = 0; i < PROBATION.probationStreak; i++) {
      const { unitId } = await unanimousUnit(sys, [a, b, c]);
      await verdict(sys, unitId, [ACCEPT, ACCEPT, ACCEPT]);
    }
    const trusted = await unanimousUnit(sys, [a, b, c]);
    await expect(trusted.tx).to.not.emit(sys.market, "VerificationRequested");
    expect((await sys.market.getUnit(trusted.unitId)).state).to.equal(UNIT_STATE.Finalized);
    const mixed = await unanimousUnit(sys, [a, b, newcomer]);
    await expect(mixed.tx).to.emit(sys.market, "VerificationRequested").withArgs(mixed.unitId);
    expect((await sys.market.getUnit(mixed.unitId)).state).to.equal(UNIT_STATE.Revealing);
    expect((await sys.market.params()).probationStreak).to.equal(BigInt(PROBATION.probationStreak));
  });

  it("a fault puts a provider back on probation", async function () {
    const sys = await loadFixture(probationFixture);
    const [a, b, c] = sys.providers.slice(0, 3);
    for (let i = 0; i < PROBATION.probationStreak; i++) {
      const { unitId } = await unanimousUnit(sys, [a, b, c]);
      await verdict(sys, unitId, [ACCEPT, ACCEPT, i === 1 ? FAULT : ACCEPT]);
    }
    expect((await sys.market.reputationOf(c.address)).consecutiveValid).to.equal(0n);
    const { tx, unitId } = await unanimousUnit(sys, [a, b, c]);
    await expect(tx).to.emit(sys.market, "VerificationRequested").withArgs(unitId);
  });
});

describe("JobMarket: withholding a reveal", function () {
  it("3 replicas, one withholds: the verdict pays the two honest ones and slashes the withholder", async function () {
    const sys = await loadFixture(h.systemFixture);
    const { unitId, orderId, providers } = await h.unitAt(sys, "committed", null, { units: 1 });
    const digests = providers.map(() => h.digestOf("same"));
    for (const i of [0, 1]) await sys.market.reveal(unitId, providers[i].address, digests[i], h.saltOf(`${unitId}:${i}`));
    const { revealDeadline } = await sys.market.getUnit(unitId);
    await time.setNextBlockTimestamp(revealDeadline + 1n);
    const withholder = providers[2];
    const tx = verdict(sys, unitId, [ACCEPT, ACCEPT, FAULT]);
    await expect(tx).to.emit(sys.market, "RevealWithheld").withArgs(unitId, withholder.address, PARAMS.withholdPenalty);
    for (const p of providers.slice(0, 2)) expect(await sys.market.credits(p.address)).to.equal(PRICE);
    expect(await sys.market.credits(withholder.address)).to.equal(0n);
    expect(await sys.stakes.stakeOf(withholder.address)).to.deep.equal([200n * E18 - PARAMS.withholdPenalty, 0n, 0n, 0n]);
    expect(await sys.market.reputationOf(withholder.address)).to.deep.equal([0n, 1n, 0n, 0n]);
    // The penalty is shared like a fraud slash: the bounty to the signing verifiers, the rest to the buyer.
    const bounty = (PARAMS.withholdPenalty * BigInt(PARAMS.bountyBps)) / 10_000n;
    for (const v of sys.verifiers.slice(0, 2)) expect(await sys.market.credits(v.address)).to.equal((FEE + bounty) / 2n);
    expect(await sys.market.credits(sys.buyer.address)).to.equal(PARAMS.withholdPenalty - bounty);
    expect((await sys.market.getOrder(orderId)).delivered).to.equal(1n);
    await h.expectSolvent(sys);
  });

  it("on expiry a replica that committed and withheld is slashed (to the buyer), one that never committed is not",
    async function () {
      const sys = await loadFixture(h.systemFixture);
      const { unitId, providers } = await h.unitAt(sys, "assigned", null, { units: 1 });
      const digests = providers.map(() => h.digestOf("same"));
      await h.commitAll(sys, unitId, providers.slice(0, 2), digests.slice(0, 2));
      const { commitDeadline, verdictDeadline } = await sys.market.getUnit(unitId);
      await time.setNextBlockTimestamp(commitDeadline + 1n);
      await sys.market.reveal(unitId, providers[0].address, digests[0], h.saltOf(`${unitId}:0`));
      await time.setNextBlockTimestamp(verdictDeadline + 1n);
      const tx = sys.market.expireUnit(unitId);
      await expect(tx).to.emit(sys.market, "RevealWithheld").withArgs(unitId, providers[1].address, PARAMS.withholdPenalty);
      await expect(tx).to.emit(sys.market, "UnitExpired");
      const stakesAfter = [];
      for (const p of providers) stakesAfter.push((await sys.stakes.stakeOf(p.address))[0]);
      expect(stakesAfter).to.deep.equal([200n * E18, 200n * E18 - PARAMS.withholdPenalty, 200n * E18]);
      expect(await sys.market.credits(sys.buyer.address)).to.equal(PARAMS.withholdPenalty);
      await h.expectSolvent(sys);
    });
});
