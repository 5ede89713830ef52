// JobMarket: the round path (JobMarketRounds, reached by delegatecall): openRoster, stepRound, closeRoster.
"use strict";

const { expect } = require("chai");
const { ethers, network } = require("hardhat");
const { anyValue } = require("@nomicfoundation/hardhat-chai-matchers/withArgs");
const { loadFixture, time } = require("./chain");
const h = require("./helpers");

const { E18, PARAMS, PRICE, FEE } = h;
const COLLATERAL = PARAMS.providerCollateral;
const coder = ethers.AbiCoder.defaultAbiCoder();

// ------------------------------------------------------------------------------------------------
// Off-chain mirror of the round path's encodings
// ------------------------------------------------------------------------------------------------

const word = (n) => ethers.toBeHex(n, 32);
const chain = (a, b) => ethers.keccak256(ethers.concat([a, b]));
const roundUnitIdOf = (orderId, round, unit) =>
  BigInt(ethers.keccak256(coder.encode(["uint256", "uint256", "uint256"], [orderId, round, unit])));
const rosterKeyOf = (addrs, layout, replicas, unitsPerRound, rounds) => ethers.keccak256(coder.encode(
  ["address[]", "uint256", "uint8", "uint32", "uint32"], [addrs, layout, replicas, unitsPerRound, rounds]));

/** Packs slot -> provider index (5 bits a slot). */
const layoutOf = (slots) => slots.reduce((acc, p, i) => acc | (BigInt(p) << BigInt(5 * i)), 0n);
/** Replica r of every unit worked by provider r. */
const stripes = (k, unitsPerRound) => Array.from({ length: k * unitsPerRound }, (_, i) => i % k);
const usesOf = (R) => R.signers.map((_, p) => BigInt(R.slots.filter((s) => s === p).length));

/** A roster description (nothing sent). */
function rosterOf(sys, orderId, signers, opts = {}) {
  const replicas = opts.replicas ?? 3;
  const unitsPerRound = opts.unitsPerRound ?? 2;
  const slots = opts.slots ?? stripes(replicas, unitsPerRound);
  return {
    sys, orderId, signers, addrs: opts.addrs ?? signers.map((s) => s.address), slots, layout: opts.layout ?? layoutOf(slots),
    replicas, unitsPerRound, rounds: opts.rounds ?? 3, digests: {},
  };
}

async function acceptsFor(R, opts = {}) {
  const key = await R.sys.market.rosterKey(R.addrs, R.layout, R.replicas, R.unitsPerRound, R.rounds);
  const accepts = [];
  for (const s of R.signers) accepts.push(await h.signAccept(R.sys.market, s, R.orderId, key, opts));
  return accepts;
}

const openTx = (R, accepts, caller = R.sys.operator) => R.sys.market.connect(caller)
  .openRoster(R.orderId, R.addrs, R.layout, R.replicas, R.unitsPerRound, R.rounds, accepts);

async function openRoster(R) {
  return openTx(R, await acceptsFor(R));
}

/** Slot `i` of round `round`: its unit, provider, unit id, digest, salt and commitment. */
function slotData(R, round, i) {
  const unit = Math.floor(i / R.replicas);
  const provider = R.signers[R.slots[i]];
  const unitId = roundUnitIdOf(R.orderId, round, unit);
  const resultDigest = R.digests[round]?.[i] ?? h.digestOf(`${R.orderId}:${round}:${unit}`);
  const salt = h.saltOf(`${R.orderId}:${round}:${i}`);
  return { unit, provider, unitId, resultDigest, salt, commitment: h.commitmentOf(resultDigest, salt, provider.address, unitId) };
}

/** Every slot's RoundWork for `round`. opts: digests (per slot), deadline, signerAt(i), roundSigned (the round
 * the signatures name). */
async function worksFor(R, round, opts = {}) {
  if (opts.digests) R.digests[round] = opts.digests;
  const deadline = opts.deadline ?? (await h.farDeadline());
  const works = [];
  for (let i = 0; i < R.slots.length; i++) {
    const d = slotData(R, round, i);
    const signer = opts.signerAt?.(i) ?? d.provider;
    const unitId = opts.roundSigned === undefined ? d.unitId : roundUnitIdOf(R.orderId, opts.roundSigned, d.unit);
    const sig = ethers.Signature.from(await h.signMarket(signer, R.sys.market, "UnitCommit",
      { unitId, provider: d.provider.address, commitment: d.commitment, deadline }));
    works.push({ commitment: d.commitment, r: sig.r, vs: sig.yParityAndS });
  }
  return { works, deadline };
}

const openingsFor = (R, round) => R.slots.map((_, i) => {
  const d = slotData(R, round, i);
  return { resultDigest: d.resultDigest, salt: d.salt };
});

/** The chained hash the contract stores for a committed round. */
const roundHashOf = (R, round) =>
  R.slots.reduce((acc, _, i) => chain(acc, slotData(R, round, i).commitment), chain(word(R.orderId), word(round)));

/** Unit digests of a round as RoundRevealed reports them (replica 0's). */
const unitDigests = (R, round) =>
  Array.from({ length: R.unitsPerRound }, (_, u) => slotData(R, round, u * R.replicas).resultDigest);

/** stepRound revealing `reveal` (a round, or null) and committing `commit` (a round, or null). */
async function step(R, { reveal = null, commit = null, caller, ...opts } = {}) {
  const openings = reveal === null ? [] : openingsFor(R, reveal);
  const { works, deadline } = commit === null ? { works: [], deadline: 0n } : await worksFor(R, commit, opts);
  return R.sys.market.connect(caller ?? R.sys.other).stepRound(R.orderId, R.addrs, R.layout, openings, deadline, works);
}

const closeTx = (R, caller) => R.sys.market.connect(caller ?? R.sys.other).closeRoster(R.orderId, R.addrs, R.layout);

async function lockedOf(sys, account) {
  return (await sys.stakes.stakeOf(account.address ?? account))[1];
}

async function rosterState(sys, orderId) {
  const [r, pending] = await sys.market.getRoster(orderId);
  return { partiesHash: r.partiesHash, unitsPerRound: r.unitsPerRound, rounds: r.rounds, committed: r.committed,
    pendingBlock: r.pendingBlock, replicas: r.replicas, closed: r.closed, pending };
}

async function expectSolventLoose(sys) {
  const owed = (await sys.market.totalEscrow()) + (await sys.market.totalCredits());
  expect(await sys.token.balanceOf(await sys.market.getAddress())).to.be.gte(owed);
  await h.expectSolvent(sys); // exact: these tests never donate tokens
}

// ------------------------------------------------------------------------------------------------
// Fixtures: a 6-unit fixed order of 3 replicas with a roster of 3 rounds of 2 units on p1..p3
// ------------------------------------------------------------------------------------------------

const UNITS = 6;
const ESCROW = BigInt(UNITS) * (3n * PRICE + FEE);

async function orderFixture() {
  const sys = await h.systemFixture();
  const { orderId, deadline } = await h.postOrder(sys, { units: UNITS });
  return { sys, orderId, deadline, R: rosterOf(sys, orderId, sys.providers.slice(0, 3)) };
}

async function openedFixture() {
  const f = await orderFixture();
  await openRoster(f.R);
  return f;
}

async function committedFixture() {
  const f = await openedFixture();
  await step(f.R, { commit: 0 });
  return f;
}

/** A fixture with a private copy of its roster's per-round digests (tests mutate them). */
async function load(fixture) {
  const f = await loadFixture(fixture);
  return { ...f, R: { ...f.R, digests: {} } };
}

// ------------------------------------------------------------------------------------------------

describe("JobMarket: round path (JobMarketRounds)", function () {
  describe("happy path", function () {
    it("k=3, 3 providers, 2 units x 3 rounds: open, four steps, close, closeOrder and withdrawals", async function () {
      const { sys, orderId, R } = await load(orderFixture);
      const { market, token, stakes, buyer } = sys;
      const [a, b, c] = R.signers;
      expect(R.layout).to.equal(layoutOf([0, 1, 2, 0, 1, 2]));
      const key = await market.rosterKey(R.addrs, R.layout, 3, 2, 3);
      expect(key).to.equal(rosterKeyOf(R.addrs, R.layout, 3, 2, 3));
      expect(await market.roundUnitId(orderId, 2, 1)).to.equal(roundUnitIdOf(orderId, 2, 1));
      expect(await market.commitmentOf(h.digestOf("x"), h.saltOf("y"), a.address, roundUnitIdOf(orderId, 0, 0)))
        .to.equal(h.commitmentOf(h.digestOf("x"), h.saltOf("y"), a.address, roundUnitIdOf(orderId, 0, 0)));
      const marketBefore = await token.balanceOf(await market.getAddress());
      expect(marketBefore).to.equal(ESCROW);

      // open: each provider holds 2 slots a round -> locks 2 x collateral; 6 units' budget leaves the balance
      await expect(openRoster(R)).to.emit(market, "RosterOpened").withArgs(orderId, R.addrs, R.layout, 3, 2, 3);
      let order = await market.getOrder(orderId);
      expect([order.balance, order.openUnits, order.delivered]).to.deep.equal([0n, 6n, 0n]);
      for (const p of [a, b, c]) {
        expect(await lockedOf(sys, p)).to.equal(2n * COLLATERAL);
        expect(await stakes.freeStake(p.address)).to.equal(200n * E18 - 2n * COLLATERAL);
      }
      expect(await rosterState(sys, orderId)).to.deep.equal({ partiesHash: key, unitsPerRound: 2n, rounds: 3n,
        committed: 0n, pendingBlock: 0n, replicas: 3n, closed: false, pending: ethers.ZeroHash });
      expect(await market.totalEscrow()).to.equal(ESCROW);
      await expectSolventLoose(sys);

      // round 0 committed
      const tx0 = await step(R, { commit: 0 });
      await expect(tx0).to.emit(market, "RoundCommitted").withArgs(orderId, 0);
      await expect(tx0).to.not.emit(market, "RoundRevealed");
      let st = await rosterState(sys, orderId);
      expect([st.committed, st.pendingBlock, st.pending])
        .to.deep.equal([1n, BigInt((await tx0.wait()).blockNumber), roundHashOf(R, 0)]);

      // reveal 0 + commit 1, reveal 1 + commit 2
      for (const round of [1, 2]) {
        const tx = await step(R, { reveal: round - 1, commit: round });
        await expect(tx).to.emit(market, "RoundRevealed").withArgs(orderId, round - 1, unitDigests(R, round - 1));
        await expect(tx).to.emit(market, "RoundCommitted").withArgs(orderId, round);
        st = await rosterState(sys, orderId);
        expect([st.committed, st.pendingBlock, st.pending])
          .to.deep.equal([BigInt(round + 1), BigInt((await tx.wait()).blockNumber), roundHashOf(R, round)]);
      }
      expect(unitDigests(R, 1)).to.deep.equal([h.digestOf(`${orderId}:1:0`), h.digestOf(`${orderId}:1:1`)]);
      // not closable while round 2 is pending
      await expect(closeTx(R)).to.be.revertedWithCustomError(market, "RosterNotClosable")
        .withArgs(orderId, (await market.getOrder(orderId)).deadline);

      // reveal 2 only
      const tx3 = await step(R, { reveal: 2 });
      await expect(tx3).to.emit(market, "RoundRevealed").withArgs(orderId, 2, unitDigests(R, 2));
      await expect(tx3).to.not.emit(market, "RoundCommitted");
      st = await rosterState(sys, orderId);
      expect([st.committed, st.pendingBlock, st.closed]).to.deep.equal([3n, 0n, false]);
      // nothing is paid before the close
      for (const p of [a, b, c]) expect(await market.credits(p.address)).to.equal(0n);
      expect(await market.totalCredits()).to.equal(0n);

      // close (anyone): each provider 2 slots x 3 rounds x PRICE
      const paidEach = 2n * 3n * PRICE;
      await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 3, 3n * paidEach);
      for (const p of [a, b, c]) {
        expect(await market.credits(p.address)).to.equal(paidEach);
        expect(await market.reputationOf(p.address)).to.deep.equal([6n, 0n, 0n, 6n]);
        expect(await lockedOf(sys, p)).to.equal(0n);
        expect(await stakes.freeStake(p.address)).to.equal(200n * E18);
      }
      order = await market.getOrder(orderId);
      expect([order.balance, order.openUnits, order.delivered, order.closed]).to.deep.equal([6n * FEE, 0n, 6n, false]);
      expect((await rosterState(sys, orderId)).closed).to.equal(true);
      expect(await market.totalEscrow()).to.equal(6n * FEE);
      expect(await market.totalCredits()).to.equal(3n * paidEach);
      await expectSolventLoose(sys);
      // a closed roster takes no step and no second close
      await expect(step(R, { reveal: null, commit: 0 })).to.be.revertedWithCustomError(market, "RosterNotOpen")
        .withArgs(orderId);
      await expect(closeTx(R)).to.be.revertedWithCustomError(market, "RosterNotOpen").withArgs(orderId);

      // the buyer gets the unused verifier fees back
      await expect(market.connect(buyer).closeOrder(orderId)).to.emit(market, "OrderClosed").withArgs(orderId, 6n * FEE);
      expect(await market.credits(buyer.address)).to.equal(6n * FEE);
      const buyerBefore = await token.balanceOf(buyer.address);
      await expect(market.connect(buyer).withdrawCredit()).to.emit(market, "CreditWithdrawn").withArgs(buyer.address, 6n * FEE);
      expect(await token.balanceOf(buyer.address)).to.equal(buyerBefore + 6n * FEE);
      for (const p of [a, b, c]) {
        const before = await token.balanceOf(p.address);
        await expect(market.connect(p).withdrawCredit()).to.emit(market, "CreditWithdrawn").withArgs(p.address, paidEach);
        expect(await token.balanceOf(p.address)).to.equal(before + paidEach);
        expect(await market.credits(p.address)).to.equal(0n);
      }
      expect([await market.totalEscrow(), await market.totalCredits()]).to.deep.equal([0n, 0n]);
      expect(await token.balanceOf(await market.getAddress())).to.equal(0n);
      await expectSolventLoose(sys);
    });

    it("a mixed layout (4 providers, uneven slots) locks and pays each provider per slot it holds", async function () {
      const sys = await loadFixture(h.systemFixture);
      const { market } = sys;
      const { orderId } = await h.postOrder(sys, { units: 6 });
      // unit 0: a b c, unit 1: d a b -> a 2, b 2, c 1, d 1 slots a round
      const R = rosterOf(sys, orderId, sys.providers, { slots: [0, 1, 2, 3, 0, 1], rounds: 2 });
      const uses = usesOf(R);
      expect(uses).to.deep.equal([2n, 2n, 1n, 1n]);
      await openRoster(R);
      for (let p = 0; p < 4; p++) expect(await lockedOf(sys, R.signers[p])).to.equal(uses[p] * COLLATERAL);
      expect((await market.getOrder(orderId)).balance).to.equal(2n * (3n * PRICE + FEE));
      await step(R, { commit: 0 });
      await step(R, { reveal: 0, commit: 1 });
      await expect(step(R, { reveal: 1 })).to.emit(market, "RoundRevealed");
      await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 2, 2n * 6n * PRICE);
      for (let p = 0; p < 4; p++) {
        expect(await market.credits(R.addrs[p])).to.equal(uses[p] * 2n * PRICE);
        expect(await market.reputationOf(R.addrs[p])).to.deep.equal([uses[p] * 2n, 0n, 0n, uses[p] * 2n]);
        expect(await lockedOf(sys, R.signers[p])).to.equal(0n);
      }
      // the 2 units outside the roster stay with the order (and the per-unit path can still use them)
      const order = await market.getOrder(orderId);
      expect([order.balance, order.delivered, order.openUnits]).to.deep.equal([2n * (3n * PRICE + FEE) + 4n * FEE, 4n, 0n]);
      await h.assignUnit(sys, orderId);
      await h.assignUnit(sys, orderId);
      await expect(h.assignUnit(sys, orderId)).to.be.revertedWithCustomError(market, "NoUnitBudget").withArgs(orderId);
      await expectSolventLoose(sys);
    });
  });

  describe("k=1 on an adaptive order", function () {
    const STREAK = 2;

    async function adaptiveFixture() {
      const sys = await h.systemFixture();
      const deadline = BigInt(await time.latest()) + 30n * 24n * 3600n;
      const receipt = await (await sys.market.connect(sys.buyer)
        .postAdaptiveOrder(ethers.id("spec"), 6, 1, 3, STREAK, PRICE, FEE, deadline)).wait();
      const orderId = receipt.logs.map((l) => sys.market.interface.parseLog(l)).find((e) => e && e.name === "OrderPosted")
        .args.orderId;
      return { sys, orderId };
    }

    /** One per-unit unit on p1..p3, unanimous and finalized (builds each one's streak). */
    async function settleUnit(sys, orderId) {
      const providers = sys.providers.slice(0, 3);
      const { unitId } = await h.assignUnit(sys, orderId, { providers });
      const digests = providers.map(() => h.digestOf("same"));
      await h.commitAll(sys, unitId, providers, digests);
      await h.revealAll(sys, unitId, providers, digests);
      await sys.market.connect(sys.operator).finalize(unitId);
    }

    it("opens a one-replica roster for a provider with the streak, refuses one without, and refunds the unused replicas",
      async function () {
      const { sys, orderId } = await loadFixture(adaptiveFixture);
      const { market } = sys;
      const [a, , , d] = sys.providers;
      // newcomer d alone: below the trusted streak; a newcomer a too, before its streak
      await expect(openRoster(rosterOf(sys, orderId, [d], { replicas: 1, rounds: 2 })))
        .to.be.revertedWithCustomError(market, "ProviderNotTrusted").withArgs(d.address, STREAK);
      await expect(openRoster(rosterOf(sys, orderId, [a], { replicas: 1, rounds: 2 })))
        .to.be.revertedWithCustomError(market, "ProviderNotTrusted").withArgs(a.address, STREAK);
      for (let i = 0; i < STREAK; i++) await settleUnit(sys, orderId);
      expect((await market.reputationOf(a.address)).consecutiveValid).to.equal(BigInt(STREAK));
      await expect(openRoster(rosterOf(sys, orderId, [d], { replicas: 1, rounds: 2 })))
        .to.be.revertedWithCustomError(market, "ProviderNotTrusted").withArgs(d.address, STREAK);
      // a mixed roster of 2 replicas (< max 3) needs every provider trusted
      await expect(openRoster(rosterOf(sys, orderId, [a, d], { replicas: 2, unitsPerRound: 1, rounds: 1 })))
        .to.be.revertedWithCustomError(market, "ProviderNotTrusted").withArgs(d.address, STREAK);

      const balanceBefore = (await market.getOrder(orderId)).balance;
      expect(balanceBefore).to.equal(6n * (3n * PRICE + FEE) - 2n * 3n * PRICE); // 2 units paid, fees returned
      const R = { ...rosterOf(sys, orderId, [a], { replicas: 1, unitsPerRound: 2, rounds: 2 }), digests: {} };
      expect(R.layout).to.equal(0n);
      await expect(openRoster(R)).to.emit(market, "RosterOpened").withArgs(orderId, [a.address], 0n, 1, 2, 2);
      expect(await lockedOf(sys, a)).to.equal(2n * COLLATERAL);
      expect((await market.getOrder(orderId)).balance).to.equal(balanceBefore - 4n * (PRICE + FEE));
      await step(R, { commit: 0 });
      await expect(step(R, { reveal: 0, commit: 1 })).to.emit(market, "RoundRevealed").withArgs(orderId, 0, unitDigests(R, 0));
      await step(R, { reveal: 1 });
      await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 2, 4n * PRICE);
      expect(await market.credits(a.address)).to.equal(2n * PRICE + 4n * PRICE); // 2 per-unit + 4 round units
      expect(await market.reputationOf(a.address)).to.deep.equal([6n, 0n, 0n, 6n]);
      expect(await lockedOf(sys, a)).to.equal(0n);
      const order = await market.getOrder(orderId);
      expect([order.delivered, order.openUnits, order.balance]).to.deep.equal([6n, 0n, balanceBefore - 4n * PRICE]);
      await expect(market.connect(sys.buyer).closeOrder(orderId)).to.emit(market, "OrderClosed")
        .withArgs(orderId, 6n * (3n * PRICE + FEE) - 2n * 3n * PRICE - 4n * PRICE);
      await expectSolventLoose(sys);
    });

    it("a full-replica roster on the adaptive order takes newcomers (only the trusted streak of reduced units applies)",
      async function () {
      const { sys, orderId } = await loadFixture(adaptiveFixture);
      const R = rosterOf(sys, orderId, sys.providers.slice(1, 4), { unitsPerRound: 1, rounds: 2 });
      await expect(openRoster(R)).to.emit(sys.market, "RosterOpened");
    });
  });

  describe("openRoster refusals", function () {
    it("refuses an unknown, a closed and an expired order, and a second roster", async function () {
      const { sys, orderId, R } = await load(openedFixture);
      const { market } = sys;
      const three = sys.providers.slice(0, 3);
      await expect(openRoster(rosterOf(sys, 99n, three))).to.be.revertedWithCustomError(market, "UnknownOrder").withArgs(99n);
      await expect(openRoster(R)).to.be.revertedWithCustomError(market, "RosterExists").withArgs(orderId);
      const closed = (await h.postOrder(sys, { units: 6 })).orderId;
      await market.connect(sys.buyer).closeOrder(closed);
      await expect(openRoster(rosterOf(sys, closed, three))).to.be.revertedWithCustomError(market, "OrderNotOpen")
        .withArgs(closed);
      const { orderId: late, deadline } = await h.postOrder(sys, { units: 6, deadline: BigInt(await time.latest()) + 100n });
      const lateR = rosterOf(sys, late, three, { rounds: 1 });
      const accepts = await acceptsFor(lateR, { deadline: deadline + 10_000n });
      await time.increaseTo(deadline + 1n);
      await expect(openTx(lateR, accepts)).to.be.revertedWithCustomError(market, "OrderExpired").withArgs(late, deadline);
    });

    it("refuses bad replica counts, zero units, a missing accept and a roster past the order's budget", async function () {
      const { sys, orderId, R } = await load(orderFixture);
      const { market } = sys;
      const three = sys.providers.slice(0, 3);
      await expect(openRoster(rosterOf(sys, orderId, three.slice(0, 2), { replicas: 2 })))
        .to.be.revertedWithCustomError(market, "InvalidReplicaCount").withArgs(2);
      await expect(openRoster(rosterOf(sys, orderId, sys.providers, { replicas: 4, unitsPerRound: 1 })))
        .to.be.revertedWithCustomError(market, "InvalidReplicaCount").withArgs(4);
      await expect(openRoster(rosterOf(sys, orderId, three, { unitsPerRound: 0, slots: [0, 1, 2] })))
        .to.be.revertedWithCustomError(market, "ZeroUnits");
      await expect(openRoster(rosterOf(sys, orderId, three, { rounds: 0 }))).to.be.revertedWithCustomError(market, "ZeroUnits");
      const accepts = await acceptsFor(R);
      await expect(openTx(R, accepts.slice(0, 2))).to.be.revertedWithCustomError(market, "ProviderCountMismatch")
        .withArgs(3, 2);
      await expect(openRoster(rosterOf(sys, orderId, three, { rounds: 4 }))) // 8 units of an order of 6
        .to.be.revertedWithCustomError(market, "NoUnitBudget").withArgs(orderId);
      // units already taken by the per-unit path count against the roster
      await h.assignUnit(sys, orderId);
      await expect(openRoster(R)).to.be.revertedWithCustomError(market, "NoUnitBudget").withArgs(orderId);
      await expect(openRoster(rosterOf(sys, orderId, three, { unitsPerRound: 1, rounds: 5 }))).to.emit(market, "RosterOpened");
      expect((await market.getOrder(orderId)).openUnits).to.equal(6n);
    });

    it("refuses bad layouts: index out of range, a provider twice in a unit, an unused provider, stray bits, > 51 slots",
      async function () {
      const { sys, orderId } = await load(orderFixture);
      const { market } = sys;
      const three = sys.providers.slice(0, 3);
      const dummy = (n) => Array.from({ length: n }, () => ({ nonce: 0n, deadline: ethers.MaxUint256, signature: "0x" }));
      const tryLayout = (signers, opts, n = signers.length) => openTx(rosterOf(sys, orderId, signers, opts), dummy(n));
      await expect(tryLayout(three, { slots: [0, 1, 2, 0, 1, 3] })).to.be.revertedWithCustomError(market, "InvalidLayout")
        .withArgs(5);
      await expect(tryLayout(three, { slots: [0, 1, 2, 1, 2, 1] })).to.be.revertedWithCustomError(market, "InvalidLayout")
        .withArgs(5);
      await expect(tryLayout(three, { slots: [0, 1, 2, 2, 2, 1] })).to.be.revertedWithCustomError(market, "InvalidLayout")
        .withArgs(4);
      await expect(tryLayout(sys.providers, { slots: [0, 1, 2, 0, 1, 2] })).to.be.revertedWithCustomError(market,
        "InvalidLayout").withArgs(6); // providers[3] unused
      await expect(tryLayout(three, { layout: layoutOf([0, 1, 2, 0, 1, 2]) | (1n << 30n) }))
        .to.be.revertedWithCustomError(market, "InvalidLayout").withArgs(6);
      await expect(tryLayout([], { slots: [], unitsPerRound: 2 })).to.be.revertedWithCustomError(market, "InvalidLayout")
        .withArgs(6);
      const big = (await h.postOrder(sys, { units: 20 })).orderId;
      await expect(openTx(rosterOf(sys, big, three, { unitsPerRound: 18, rounds: 1, layout: 0n }), dummy(3)))
        .to.be.revertedWithCustomError(market, "InvalidLayout").withArgs(54);
      // 51 slots is the most (17 units of 3): the layout passes, the (dummy) accepts do not
      await expect(openTx(rosterOf(sys, big, three, { unitsPerRound: 17, rounds: 1 }), dummy(3)))
        .to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(three[0].address, ethers.ZeroAddress);
    });

    it("refuses the same provider listed twice, bad or replayed accepts, short stake and a non-operator", async function () {
      const { sys, orderId, R } = await load(orderFixture);
      const { market, other } = sys;
      const [a, b, c] = sys.providers;
      // [a, a, b]: every index used, no index twice in a unit, but a holds two entries
      const dup = rosterOf(sys, orderId, [a, a, b]);
      await expect(openRoster(dup)).to.be.revertedWithCustomError(market, "DuplicateParty").withArgs(a.address);
      // accepts signed by another key, for another roster, or expired
      const key = await market.rosterKey(R.addrs, R.layout, 3, 2, 3);
      const forged = [await h.signAccept(market, a, orderId, key, { signer: other }),
        await h.signAccept(market, b, orderId, key), await h.signAccept(market, c, orderId, key)];
      await expect(openTx(R, forged)).to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(a.address, other.address);
      const otherShape = await acceptsFor({ ...R, rounds: 2 });
      await expect(openTx(R, otherShape)).to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(a.address, anyValue);
      const past = (await time.latest()) - 1n;
      const expired = await acceptsFor(R, { deadline: past });
      await expect(openTx(R, expired)).to.be.revertedWithCustomError(market, "SignatureExpired").withArgs(past, anyValue);
      // non-operator
      const accepts = await acceptsFor(R);
      await expect(openTx(R, accepts, sys.buyer)).to.be.revertedWithCustomError(market, "AccessControlUnauthorizedAccount")
        .withArgs(sys.buyer.address, await market.OPERATOR_ROLE());
      await expect(openTx(R, accepts)).to.emit(market, "RosterOpened");
      // the same Accept nonces cannot open another order's roster
      const second = (await h.postOrder(sys, { units: 6 })).orderId;
      for (const p of [a, b, c]) await sys.stakes.connect(p).stake(200n * E18);
      const R2 = rosterOf(sys, second, [a, b, c]);
      const key2 = await market.rosterKey(R2.addrs, R2.layout, 3, 2, 3);
      const replayed = [];
      for (let i = 0; i < 3; i++) replayed.push(await h.signAccept(market, R2.signers[i], second, key2, { nonce: accepts[i].nonce }));
      await expect(openTx(R2, replayed)).to.be.revertedWithCustomError(market, "AcceptNonceUsed").withArgs(a.address, accepts[0].nonce);
      // a provider without the free stake for its slots (3 slots a round: 300 > 400 bonded - 200 locked)
      const R3 = rosterOf(sys, second, [a, b, c], { unitsPerRound: 3, rounds: 1 });
      await expect(openRoster(R3)).to.be.revertedWithCustomError(sys.stakes, "InsufficientFreeStake");
      await expect(openRoster(R2)).to.emit(market, "RosterOpened");
      await expectSolventLoose(sys);
    });

    it("refuses providers on probation (probationStreak 1) until they have a valid unit", async function () {
      const sys = await h.fundedSystem({ ...PARAMS, probationStreak: 1 });
      const { market } = sys;
      const { orderId } = await h.postOrder(sys, { units: 8 });
      const R = rosterOf(sys, orderId, sys.providers.slice(0, 3), { rounds: 1 });
      await expect(openRoster(R)).to.be.revertedWithCustomError(market, "ProviderNotTrusted")
        .withArgs(sys.providers[0].address, 1);
      // one unit on the per-unit path: drawn (probation), settled by a verdict accepting all
      const { unitId, providers } = await h.assignUnit(sys, orderId);
      const digests = providers.map(() => h.digestOf("same"));
      await h.commitAll(sys, unitId, providers, digests);
      await h.revealAll(sys, unitId, providers, digests);
      const outcomes = [0, 0, 0];
      const sigs = [];
      for (const v of sys.verifiers.slice(0, 2)) sigs.push(await h.signVerdict(market, v, unitId, outcomes));
      await market.connect(sys.other).submitVerdict(unitId, outcomes, sigs);
      expect((await market.reputationOf(providers[0].address)).consecutiveValid).to.equal(1n);
      await expect(openRoster(R)).to.emit(market, "RosterOpened");
    });
  });

  describe("stepRound", function () {
    it("needs the roster's exact providers and layout, and something to do", async function () {
      const { sys, orderId, R } = await load(openedFixture);
      const { market } = sys;
      const none = (await h.postOrder(sys, { units: 6 })).orderId;
      await expect(step({ ...R, orderId: none }, { commit: 0 })).to.be.revertedWithCustomError(market, "RosterNotOpen")
        .withArgs(none);
      const swapped = [R.addrs[1], R.addrs[0], R.addrs[2]];
      await expect(step({ ...R, addrs: swapped }, { commit: 0 })).to.be.revertedWithCustomError(market, "RosterMismatch")
        .withArgs(orderId);
      await expect(step({ ...R, layout: layoutOf([0, 1, 2, 1, 2, 0]) }, { commit: 0 }))
        .to.be.revertedWithCustomError(market, "RosterMismatch").withArgs(orderId);
      await expect(market.stepRound(orderId, R.addrs, R.layout, [], 0, [])).to.be.revertedWithCustomError(market, "EmptyBatch");
      // nothing pending: openings alone are nothing to do (they are ignored, see the copied-reveal test)
      await expect(market.stepRound(orderId, R.addrs, R.layout, openingsFor(R, 0), 0, []))
        .to.be.revertedWithCustomError(market, "EmptyBatch");
      const { works, deadline } = await worksFor(R, 0);
      await expect(market.stepRound(orderId, R.addrs, R.layout, [], deadline, works.slice(0, 5)))
        .to.be.revertedWithCustomError(market, "EntryCountMismatch").withArgs(6, 5);
      await market.stepRound(orderId, R.addrs, R.layout, [], deadline, works);
      // pending: its openings are required, all of them
      const next = await worksFor(R, 1);
      await expect(market.stepRound(orderId, R.addrs, R.layout, [], next.deadline, next.works))
        .to.be.revertedWithCustomError(market, "EntryCountMismatch").withArgs(6, 0);
      await expect(market.stepRound(orderId, R.addrs, R.layout, openingsFor(R, 0).slice(1), 0, []))
        .to.be.revertedWithCustomError(market, "EntryCountMismatch").withArgs(6, 5);
    });

    it("refuses a forged work signature and an expired one", async function () {
      const { sys, R } = await load(openedFixture);
      const { market, other } = sys;
      await expect(step(R, { commit: 0, signerAt: (i) => (i === 4 ? other : undefined) }))
        .to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(R.addrs[1], other.address);
      const past = (await time.latest()) - 1n;
      await expect(step(R, { commit: 0, deadline: past })).to.be.revertedWithCustomError(market, "SignatureExpired")
        .withArgs(past, anyValue);
      // a malformed compact signature recovers nobody
      const { works, deadline } = await worksFor(R, 0);
      works[0] = { ...works[0], r: ethers.ZeroHash };
      await expect(market.stepRound(R.orderId, R.addrs, R.layout, [], deadline, works))
        .to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(R.addrs[0], ethers.ZeroAddress);
    });

    it("refuses a work signature replayed into another round or another order (its unit id differs)", async function () {
      const { sys, orderId, R } = await load(openedFixture);
      const { market } = sys;
      // round 1's works signed over round 0's unit ids
      await step(R, { commit: 0 });
      await expect(step(R, { reveal: 0, commit: 1, roundSigned: 0 })).to.be.revertedWithCustomError(market, "InvalidSigner")
        .withArgs(R.addrs[0], anyValue);
      // round 0's very works (same commitments, same signatures) resent for round 1
      const again = { ...R, digests: {} };
      const round0 = await worksFor(again, 0);
      await expect(market.stepRound(orderId, R.addrs, R.layout, openingsFor(R, 0), round0.deadline, round0.works))
        .to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(R.addrs[0], anyValue);
      // another order with the same providers and shape: order 1's round 0 works do not pass for it
      for (const p of R.signers) await sys.stakes.connect(p).stake(200n * E18);
      const second = (await h.postOrder(sys, { units: 6 })).orderId;
      const R2 = rosterOf(sys, second, R.signers);
      await openRoster(R2);
      await expect(market.stepRound(second, R2.addrs, R2.layout, [], round0.deadline, round0.works))
        .to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(R.addrs[0], anyValue);
      await expect(step(R2, { commit: 0 })).to.emit(market, "RoundCommitted").withArgs(second, 0);
    });

    it("refuses openings that do not match the round's commitments (RoundHashMismatch)", async function () {
      const { sys, orderId, R } = await load(committedFixture);
      const { market } = sys;
      const good = openingsFor(R, 0);
      const badSalt = good.map((o, i) => (i === 2 ? { ...o, salt: h.saltOf("other") } : o));
      await expect(market.stepRound(orderId, R.addrs, R.layout, badSalt, 0, [])).to.be.revertedWithCustomError(market,
        "RoundHashMismatch").withArgs(orderId, 0);
      // a changed digest, even the same one for the whole unit
      const badDigest = good.map((o, i) => (i < 3 ? { ...o, resultDigest: h.digestOf("forged") } : o));
      await expect(market.stepRound(orderId, R.addrs, R.layout, badDigest, 0, [])).to.be.revertedWithCustomError(market,
        "RoundHashMismatch").withArgs(orderId, 0);
      // the right openings in another slot order
      const swapped = [good[1], good[0], ...good.slice(2)];
      await expect(market.stepRound(orderId, R.addrs, R.layout, swapped, 0, [])).to.be.revertedWithCustomError(market,
        "RoundHashMismatch").withArgs(orderId, 0);
      await expect(market.stepRound(orderId, R.addrs, R.layout, good, 0, [])).to.emit(market, "RoundRevealed");
    });

    it("refuses a non-unanimous unit (RoundUnitNeedsVerdict, drawn=false); the round stays pending and unpaid",
      async function () {
      const { sys, orderId, deadline, R } = await load(openedFixture);
      const { market } = sys;
      const digests = R.slots.map((_, i) => h.digestOf(`u${Math.floor(i / 3)}`));
      digests[4] = h.digestOf("dissent"); // unit 1, replica 1
      await step(R, { commit: 0, digests });
      const pendingBefore = await rosterState(sys, orderId);
      await expect(step(R, { reveal: 0, commit: 1 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
        .withArgs(orderId, 0, 1, false);
      await expect(step(R, { reveal: 0 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
        .withArgs(orderId, 0, 1, false);
      expect(await rosterState(sys, orderId)).to.deep.equal(pendingBefore);
      await expect(closeTx(R)).to.be.revertedWithCustomError(market, "RosterNotClosable").withArgs(orderId, deadline);
      await time.increaseTo(deadline + 1n);
      await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 0, 0);
      for (const p of R.signers) {
        expect(await market.credits(p.address)).to.equal(0n);
        expect(await lockedOf(sys, p)).to.equal(0n);
        expect(await market.reputationOf(p.address)).to.deep.equal([0n, 0n, 0n, 0n]);
      }
      await expect(market.connect(sys.other).closeOrder(orderId)).to.emit(market, "OrderClosed").withArgs(orderId, ESCROW);
      await expectSolventLoose(sys);
    });

    it("refuses a drawn unit (spotCheckPpm 1e6: RoundUnitNeedsVerdict drawn=true); k=1 is drawn at the solo rate",
      async function () {
      const sys = await h.fundedSystem({ ...PARAMS, spotCheckPpm: 1_000_000 });
      const { market } = sys;
      const { orderId } = await h.postOrder(sys, { units: 6 });
      const R = rosterOf(sys, orderId, sys.providers.slice(0, 3));
      await openRoster(R);
      await step(R, { commit: 0 });
      await expect(step(R, { reveal: 0 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
        .withArgs(orderId, 0, 0, true);
      // k=1: the multi-replica rate does not apply to a one-replica roster
      const solo = (await h.postOrder(sys, { units: 2, replicas: 1 })).orderId;
      const S = rosterOf(sys, solo, [sys.providers[3]], { replicas: 1, unitsPerRound: 1, rounds: 2 });
      await openRoster(S);
      await step(S, { commit: 0 });
      await expect(step(S, { reveal: 0 })).to.emit(market, "RoundRevealed");
      const sys2 = await h.fundedSystem({ ...PARAMS, soloSpotCheckPpm: 1_000_000 });
      const solo2 = (await h.postOrder(sys2, { units: 2, replicas: 1 })).orderId;
      const S2 = rosterOf(sys2, solo2, [sys2.providers[0]], { replicas: 1, unitsPerRound: 1, rounds: 2 });
      await openRoster(S2);
      await step(S2, { commit: 0 });
      await expect(step(S2, { reveal: 0 })).to.be.revertedWithCustomError(sys2.market, "RoundUnitNeedsVerdict")
        .withArgs(solo2, 0, 0, true);
    });

    it("a round left pending for more than 256 blocks can no longer be revealed (seed gone: every unit drawn)",
      async function () {
      const { sys, orderId, R } = await load(committedFixture);
      await network.provider.send("hardhat_mine", ["0x101"]);
      await expect(step(R, { reveal: 0 })).to.be.revertedWithCustomError(sys.market, "RoundUnitNeedsVerdict")
        .withArgs(orderId, 0, 0, true);
    });

    it("refuses a reveal in the block that committed the round (RoundRevealTooEarly)", async function () {
      const { sys, orderId, R } = await load(openedFixture);
      const { market } = sys;
      const { works, deadline } = await worksFor(R, 0);
      const commit = market.interface.encodeFunctionData("stepRound", [orderId, R.addrs, R.layout, [], deadline, works]);
      const reveal = market.interface.encodeFunctionData("stepRound", [orderId, R.addrs, R.layout, openingsFor(R, 0), 0, []]);
      const nextBlock = BigInt(await ethers.provider.getBlockNumber()) + 1n;
      await expect(market.connect(sys.other).multicall([commit, reveal])).to.be.revertedWithCustomError(market,
        "RoundRevealTooEarly").withArgs(orderId, nextBlock);
      const seedBlock = (await (await market.connect(sys.other).multicall([commit])).wait()).blockNumber;
      await expect(market.stepRound.staticCall(orderId, R.addrs, R.layout, openingsFor(R, 0), 0, [], { blockTag: seedBlock }))
        .to.be.revertedWithCustomError(market, "RoundRevealTooEarly").withArgs(orderId, seedBlock);
      // two transactions in one block (automine off): the reveal fails, the commit stands
      const R2 = { ...R, digests: {} };
      await step(R2, { reveal: 0 });
      const next = await worksFor(R2, 1);
      await network.provider.send("evm_setAutomine", [false]);
      try {
        const commitTx = await market.connect(sys.other).stepRound(orderId, R.addrs, R.layout, [], next.deadline, next.works,
          { gasLimit: 2_000_000 });
        const revealTx = await market.connect(sys.other).stepRound(orderId, R.addrs, R.layout, openingsFor(R2, 1), 0, [],
          { gasLimit: 2_000_000 });
        await network.provider.send("evm_mine", []);
        expect((await commitTx.wait()).status).to.equal(1);
        await expect(revealTx.wait()).to.be.rejected;
      } finally {
        await network.provider.send("evm_setAutomine", [true]);
      }
      expect((await rosterState(sys, orderId)).committed).to.equal(2n);
      await expect(step(R2, { reveal: 1 })).to.emit(market, "RoundRevealed").withArgs(orderId, 1, unitDigests(R2, 1));
    });

    it("refuses a commit past the order deadline (OrderExpired) and past the last round (NoRoundToStep)", async function () {
      const { sys, orderId, R } = await load(orderFixture);
      const { market } = sys;
      // NoRoundToStep: a one-round roster on the fixture's order
      const one = { ...rosterOf(sys, orderId, R.signers, { rounds: 1 }), digests: {} };
      await openRoster(one);
      await step(one, { commit: 0 });
      await expect(step(one, { reveal: 0, commit: 1 })).to.be.revertedWithCustomError(market, "NoRoundToStep")
        .withArgs(orderId, 1);
      await step(one, { reveal: 0 });
      await expect(step(one, { commit: 1 })).to.be.revertedWithCustomError(market, "NoRoundToStep").withArgs(orderId, 1);
      await expect(step(one, {})).to.be.revertedWithCustomError(market, "EmptyBatch");
      // OrderExpired: signatures still valid, the order's deadline passed
      for (const p of R.signers) await sys.stakes.connect(p).stake(200n * E18);
      const { orderId: late, deadline } = await h.postOrder(sys, { units: 6, deadline: BigInt(await time.latest()) + 1000n });
      const L = rosterOf(sys, late, R.signers);
      await openRoster(L);
      await step(L, { commit: 0 });
      const far = deadline + 100_000n;
      const next = await worksFor(L, 1, { deadline: far });
      await time.increaseTo(deadline + 1n);
      await expect(market.stepRound(late, L.addrs, L.layout, openingsFor(L, 0), far, next.works))
        .to.be.revertedWithCustomError(market, "OrderExpired").withArgs(late, deadline);
      // revealing the pending round is still allowed after the deadline, and then paid at close
      await expect(step(L, { reveal: 0 })).to.emit(market, "RoundRevealed");
      await expect(closeTx(L)).to.emit(market, "RosterClosed").withArgs(late, 1, 6n * PRICE);
      await expectSolventLoose(sys);
    });
  });

  describe("closeRoster", function () {
    it("is refused before every round is revealed; the order cannot be closed under an open roster", async function () {
      const { sys, orderId, deadline, R } = await load(openedFixture);
      const { market } = sys;
      await expect(closeTx(R)).to.be.revertedWithCustomError(market, "RosterNotClosable").withArgs(orderId, deadline);
      await step(R, { commit: 0 });
      await expect(closeTx(R)).to.be.revertedWithCustomError(market, "RosterNotClosable").withArgs(orderId, deadline);
      await step(R, { reveal: 0, commit: 1 });
      await expect(closeTx(R)).to.be.revertedWithCustomError(market, "RosterNotClosable").withArgs(orderId, deadline);
      await expect(market.connect(sys.buyer).closeOrder(orderId)).to.be.revertedWithCustomError(market, "UnitsStillOpen")
        .withArgs(orderId, 6);
      await expect(market.closeRoster(orderId, R.addrs, layoutOf([1, 2, 0, 1, 2, 0])))
        .to.be.revertedWithCustomError(market, "RosterMismatch").withArgs(orderId);
      const none = (await h.postOrder(sys, { units: 1 })).orderId;
      await expect(market.closeRoster(none, R.addrs, R.layout)).to.be.revertedWithCustomError(market, "RosterNotOpen")
        .withArgs(none);
    });

    it("after the deadline, with a round pending: pays only the settled rounds and releases all collateral", async function () {
      const { sys, orderId, deadline, R } = await load(openedFixture);
      const { market } = sys;
      await step(R, { commit: 0 });
      await step(R, { reveal: 0, commit: 1 }); // round 0 settled, round 1 pending, round 2 never committed
      const pendingSince = BigInt(await time.latest());
      await time.increaseTo(deadline + 1n);
      // the pending round may still be revealed for revealWindow after its commit when that ends later
      expect(pendingSince + PARAMS.revealWindow).to.be.lessThan(deadline);
      const paid = 3n * 2n * PRICE; // 3 providers x 2 slots x 1 round
      await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 1, paid);
      for (const p of R.signers) {
        expect(await market.credits(p.address)).to.equal(2n * PRICE);
        expect(await market.reputationOf(p.address)).to.deep.equal([2n, 0n, 0n, 2n]);
        expect(await lockedOf(sys, p)).to.equal(0n);
      }
      const order = await market.getOrder(orderId);
      expect([order.balance, order.delivered, order.openUnits]).to.deep.equal([ESCROW - paid, 2n, 0n]);
      expect(await rosterState(sys, orderId)).to.include({ committed: 2n, closed: true });
      // the pending round can no longer be revealed
      await expect(step(R, { reveal: 1 })).to.be.revertedWithCustomError(market, "RosterNotOpen").withArgs(orderId);
      await expect(market.connect(sys.other).closeOrder(orderId)).to.emit(market, "OrderClosed").withArgs(orderId, ESCROW - paid);
      expect(await market.credits(sys.buyer.address)).to.equal(ESCROW - paid);
      expect(await market.totalEscrow()).to.equal(0n);
      expect(await market.totalCredits()).to.equal(ESCROW);
      await expectSolventLoose(sys);
    });

    it("a round committed just before the deadline keeps its reveal window: nobody may close the roster until it ends", async function () {
      const { sys, orderId, deadline, R } = await load(openedFixture);
      const { market } = sys;
      await step(R, { commit: 0 });
      await time.increaseTo(deadline - 10n);
      await step(R, { reveal: 0, commit: 1 }); // round 1 committed 10 s before the order's deadline
      const revealEnds = BigInt(await time.latest()) + PARAMS.revealWindow;
      await time.increaseTo(deadline + 1n);
      await expect(market.connect(sys.buyer).closeRoster(orderId, R.addrs, R.layout))
        .to.be.revertedWithCustomError(market, "RosterNotClosable").withArgs(orderId, revealEnds);
      await step(R, { reveal: 1 }); // its providers reveal in time: the round is paid
      await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 2, 2n * 3n * 2n * PRICE);
      await expectSolventLoose(sys);
    });

    it("openings copied from a relayer's pending reveal-and-commit do not make it fail", async function () {
      const { sys, orderId, R } = await load(openedFixture);
      const { market } = sys;
      await step(R, { commit: 0 });
      const { works, deadline } = await worksFor(R, 1);
      // a third party reveals round 0 first with the relayer's openings ...
      await market.connect(sys.other).stepRound(orderId, R.addrs, R.layout, openingsFor(R, 0), 0, []);
      // ... and the relayer's reveal-and-commit still commits round 1
      await expect(market.stepRound(orderId, R.addrs, R.layout, openingsFor(R, 0), deadline, works))
        .to.emit(market, "RoundCommitted").withArgs(orderId, 1)
        .and.not.to.emit(market, "RoundRevealed");
      expect(await rosterState(sys, orderId)).to.include({ committed: 2n });
    });

    it("after the deadline, with nothing committed: pays nothing and refunds the whole escrow", async function () {
      const { sys, orderId, deadline, R } = await load(openedFixture);
      await time.increaseTo(deadline + 1n);
      await expect(closeTx(R)).to.emit(sys.market, "RosterClosed").withArgs(orderId, 0, 0);
      for (const p of R.signers) expect(await lockedOf(sys, p)).to.equal(0n);
      await expect(sys.market.connect(sys.other).closeOrder(orderId)).to.emit(sys.market, "OrderClosed")
        .withArgs(orderId, ESCROW);
      await expectSolventLoose(sys);
    });
  });

  describe("the round path's own contract", function () {
    it("called on its own address, each action reverts NotDelegated; a non-operator openRoster is refused", async function () {
      const { sys, orderId, R } = await load(orderFixture);
      // the round path lives in JobMarket's delegate (JobMarketExtension at `extension()`; formerly `rounds()`)
      const [getter, artifact] = sys.market.interface.getFunction("extension")
        ? ["extension", "JobMarketExtension"] : ["rounds", "JobMarketRounds"];
      const rounds = await ethers.getContractAt(artifact, await sys.market[getter]());
      expect(await ethers.provider.getCode(await rounds.getAddress())).to.not.equal("0x");
      const accepts = await acceptsFor(R);
      for (const call of [
        () => rounds.connect(sys.operator).openRoster(orderId, R.addrs, R.layout, 3, 2, 3, accepts),
        () => rounds.stepRound(orderId, R.addrs, R.layout, [], 0, []),
        () => rounds.closeRoster(orderId, R.addrs, R.layout),
      ]) {
        await expect(call()).to.be.revertedWithCustomError(rounds, "NotDelegated");
      }
      await expect(openTx(R, accepts, sys.other)).to.be.revertedWithCustomError(sys.market, "AccessControlUnauthorizedAccount")
        .withArgs(sys.other.address, await sys.market.OPERATOR_ROLE());
      await expect(openTx(R, accepts)).to.emit(sys.market, "RosterOpened");
    });
  });

  describe("gas", function () {
    const SHARDS = 8; // M shards + 1 aggregate unit a round
    const UNITS_PER_ROUND = SHARDS + 1;

    async function gasFixture() {
      const sys = await h.systemFixture();
      // 9 slots a round each: 9 x collateral locked
      for (const p of sys.providers) await sys.stakes.connect(p).stake(700n * E18);
      return sys;
    }

    const gasOf = async (tx) => (await (await tx).wait()).gasUsed;

    async function measure(sys, k, rounds) {
      const { market } = sys;
      const g = {};
      const deadline = BigInt(await time.latest()) + 30n * 24n * 3600n;
      const postTx = await market.connect(sys.buyer).postOrder(ethers.id("gas"), UNITS_PER_ROUND * rounds, k, PRICE, FEE,
        deadline);
      const receipt = await postTx.wait();
      g.postOrder = receipt.gasUsed;
      const orderId = receipt.logs.map((l) => market.interface.parseLog(l)).find((e) => e && e.name === "OrderPosted")
        .args.orderId;
      const R = rosterOf(sys, orderId, sys.providers.slice(0, k), { replicas: k, unitsPerRound: UNITS_PER_ROUND, rounds });
      g.openRoster = await gasOf(openRoster(R));
      const steps = [];
      for (let r = 0; r <= rounds; r++) {
        steps.push(await gasOf(step(R, { reveal: r === 0 ? null : r - 1, commit: r === rounds ? null : r })));
      }
      g.closeRoster = await gasOf(closeTx(R));
      g.closeOrder = await gasOf(market.connect(sys.buyer).closeOrder(orderId));
      g.withdrawBuyer = await gasOf(market.connect(sys.buyer).withdrawCredit());
      g.withdrawProviders = 0n;
      for (const p of R.signers) g.withdrawProviders += await gasOf(market.connect(p).withdrawCredit());
      const stepsTotal = steps.reduce((x, y) => x + y, 0n);
      const total = Object.values(g).reduce((x, y) => x + y, 0n) + stepsTotal;
      const perShard = total / BigInt(SHARDS * rounds);
      console.log(`    k=${k} providers=${k} unitsPerRound=${UNITS_PER_ROUND} rounds=${rounds}: ` +
        `openRoster ${g.openRoster}, steps [${steps.join(", ")}], closeRoster ${g.closeRoster}, ` +
        `postOrder ${g.postOrder}, closeOrder ${g.closeOrder}, withdraw buyer ${g.withdrawBuyer} providers ${g.withdrawProviders}; ` +
        `TOTAL ${total}, per shard unit ${perShard}`);
      for (const s of steps) expect(s).to.be.lt(600_000n);
      expect(g.openRoster).to.be.lt(600_000n);
      expect(g.closeRoster).to.be.lt(300_000n);
      expect(perShard).to.be.lt(k === 1 ? 100_000n : 200_000n);
      const order = await market.getOrder(orderId);
      expect([order.delivered, order.closed]).to.deep.equal([BigInt(UNITS_PER_ROUND * rounds), true]);
      await expectSolventLoose(sys);
    }

    it("prints the gas of a k=3 roster (3 providers, 9 units a round) over 2 and 10 rounds", async function () {
      const sys = await loadFixture(gasFixture);
      await measure(sys, 3, 2);
      await measure(sys, 3, 10);
    });

    it("prints the gas of a k=1 roster (1 provider, 9 units a round) over 2 and 10 rounds", async function () {
      const sys = await loadFixture(gasFixture);
      await measure(sys, 1, 2);
      await measure(sys, 1, 10);
    });
  });
});
