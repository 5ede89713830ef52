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
/** A step's round audit with no posting and nothing pending. */
const NO_AUDIT = { pending: ethers.ZeroHash, verifiers: [], chain: ethers.ZeroHash, signatures: [] };
/** A step's round work that commits nothing. */
const NO_WORK = { commitments: [], signatures: [] };

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
  const key = await R.sys.market.rosterKey(R.addrs, R.layout, R.replicas, R.unitsPerRound, R.rounds, R.auditors ?? []);
  const accepts = [];
  for (const s of R.signers) accepts.push(await h.signAccept(R.sys.market, s, R.orderId, key, opts));
  return accepts;
}

const openTx = (R, accepts, caller = R.sys.operator) => R.sys.market.connect(caller)
  .openRoster(R.orderId, R.addrs, R.layout, R.replicas, R.unitsPerRound, R.rounds, R.auditors ?? [], accepts);

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

/** The RoundWork committing `round`: every slot's commitment and each roster provider's `RoundCommit` signature
 * over its slots' commitments. opts: digests (per slot), deadline, signerAt(p) (who signs for provider p),
 * roundSigned / orderSigned (the round / order the signatures name), slotsOf(p) (the slots provider p's
 * signature covers). */
async function worksFor(R, round, opts = {}) {
  if (opts.digests) R.digests[round] = opts.digests;
  const deadline = opts.deadline ?? (await h.farDeadline());
  const commitments = R.slots.map((_, i) => slotData(R, round, i).commitment);
  const signatures = [];
  for (let p = 0; p < R.addrs.length; p++) {
    const slots = opts.slotsOf?.(p) ?? R.slots.flatMap((q, i) => (q === p ? [i] : []));
    const commitmentsHash = ethers.keccak256(ethers.concat(slots.map((i) => commitments[i])));
    const signer = opts.signerAt?.(p) ?? R.signers[p];
    const sig = ethers.Signature.from(await h.signMarket(signer, R.sys.market, "RoundCommit", {
      orderId: opts.orderSigned ?? R.orderId, round: opts.roundSigned ?? round, provider: R.addrs[p], commitmentsHash, deadline,
    }));
    signatures.push({ r: sig.r, vs: sig.yParityAndS });
  }
  return { works: { commitments, signatures }, deadline };
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

const addrsOf = (accounts) => accounts.map((x) => x.address ?? x);

/** The openings a step gives for `round` with the slots in bit mask `withheld` given as withheld: such a slot's
 * entry carries its commitment in `resultDigest` (and a salt the contract ignores). */
const givenOpenings = (R, round, withheld = 0n) => openingsFor(R, round).map((o, i) =>
  ((BigInt(withheld) >> BigInt(i)) & 1n ? { resultDigest: slotData(R, round, i).commitment, salt: h.saltOf("ignored") } : o));

/** stepRound revealing `reveal` (a round, or null; the slots in bit mask `withheld` given as withheld) and
 * committing `commit` (a round, or null), with `verifiers` (signers or addresses) for the units the reveal sets
 * aside; `overrides` go to the transaction. */
async function step(R, { reveal = null, commit = null, caller, verifiers = [], withheld = 0n, audit = {}, overrides = {}, ...opts } = {}) {
  const openings = reveal === null ? [] : givenOpenings(R, reveal, withheld);
  const { works, deadline } = commit === null ? { works: NO_WORK, deadline: 0n } : await worksFor(R, commit, opts);
  const tx = await R.sys.market.connect(caller ?? R.sys.other).stepRound(R.orderId, R.addrs, R.layout, openings, withheld,
    addrsOf(verifiers), deadline, works, { ...NO_AUDIT, ...auditChainsOf(R.records ?? []), ...audit }, overrides);
  await trackAudits(R, tx);
  return tx;
}

/** A chain over `records` ({info, digestsHash} in order), from `start`. */
const auditChainOf = (records, start = ethers.ZeroHash) => records.reduce((chained, r) => ethers.keccak256(
  coder.encode(["bytes32", "uint256", "bytes32"], [chained, r.info, r.digestsHash])), start);
const POSTING = 1n << 255n;
/** A roster's posted chain (`chain`) and pending chain (`pending`) over its flat audit records from the posted
 * chain `start`: a round record extends the pending chain, a posting's record the posted chain with it. */
function auditChainsOf(records, start = ethers.ZeroHash) {
  let posted = start;
  let pending = ethers.ZeroHash;
  for (const r of records) {
    if (BigInt(r.info) & POSTING) {
      posted = auditChainOf([{ info: r.info, digestsHash: pending }], posted);
      pending = ethers.ZeroHash;
    } else pending = auditChainOf([r], pending);
  }
  return { chain: posted, pending };
}

/** Keeps `R.records`, the roster's audit records, as a mined step's RoundRevealed (its `audited` units) and
 * AuditPosted and a challenge's AuditChallenged change them. */
async function trackAudits(R, tx) {
  const receipt = await tx.wait();
  if (!receipt) return;
  for (const log of receipt.logs) {
    const e = R.sys.market.interface.parseLog(log);
    if (e?.name === "RoundRevealed" && e.args.audited !== 0n) {
      (R.records ??= []).push({ info: e.args.audited | (e.args.round << 176n), digestsHash: digestsHashOf([...e.args.digests]) });
    }
    if (e?.name === "AuditPosted") (R.records ??= []).push({ info: e.args.info, digestsHash: e.args.records });
    if (e?.name === "PendingSetAside") R.records.splice(R.records.length - Number(e.args.records));
    if (e?.name === "AuditChallenged") {
      const index = R.records.findIndex((r) => !(r.info & POSTING) && (r.info >> 176n) === e.args.round);
      R.records[index] = { ...R.records[index], info: e.args.info };
    }
  }
}

/** The operator's step, with `verifiers` for the units it sets aside. */
const opStep = (R, verifiers, args = {}) => step(R, { ...args, caller: R.sys.operator, verifiers });

const closeTx = (R, caller, records) => R.sys.market.connect(caller ?? R.sys.other)
  .closeRoster(R.orderId, R.addrs, R.layout, R.auditors ?? [], records ?? R.records ?? []);

async function lockedOf(sys, account) {
  return (await sys.stakes.stakeOf(account.address ?? account))[1];
}

async function rosterState(sys, orderId) {
  const [r, pending] = await sys.market.getRoster(orderId);
  return { partiesHash: r.partiesHash, unitsPerRound: r.unitsPerRound, rounds: r.rounds, committed: r.committed,
    pendingBlock: r.pendingBlock, pendingSince: r.pendingSince, replicas: r.replicas, closed: r.closed,
    requiredStreak: r.requiredStreak, setAsideUnits: r.setAsideUnits, openSetAside: r.openSetAside, pending };
}

/** Everything a refused step must leave as it was: the roster (pending round included) and the unit count. */
async function chainState(sys, orderId) {
  return { roster: await rosterState(sys, orderId), unitCount: await sys.market.unitCount() };
}

/** The spot-check draw of round unit `unitId` by seed `seed` (the hash of the block that committed its round;
 * zero once more than 256 blocks old: drawn), the contract's `_drawnBy`. */
function drawnBy(seed, unitId, rate) {
  if (seed === ethers.ZeroHash) return true;
  return BigInt(ethers.keccak256(coder.encode(["bytes32", "uint256"], [seed, unitId]))) % 1_000_000n < BigInt(rate);
}

/** Sends `send()` (a step that commits round `round`) until the hash of its block draws exactly the units in `want`
 * (one bool per unit) at spot-check rate `rate`: each miss is reverted and retried at a later timestamp. */
async function commitDrawing(R, round, rate, want, send) {
  for (let attempt = 1; attempt <= 100; attempt++) {
    const snapshot = await network.provider.send("evm_snapshot", []);
    await time.setNextBlockTimestamp((await time.latest()) + BigInt(attempt));
    const tx = await send();
    const block = await ethers.provider.getBlock((await tx.wait()).blockNumber);
    const drawn = want.map((_, u) => drawnBy(block.hash, roundUnitIdOf(R.orderId, round, u), rate));
    if (drawn.every((d, u) => d === want[u])) return tx;
    await network.provider.send("evm_revert", [snapshot]);
  }
  throw new Error(`no block drew ${want} in 100 tries`);
}

/** The UnitSetAside events of a step: [{ round, unit, unitId }]. */
async function setAsideOf(R, tx) {
  const receipt = await tx.wait();
  return receipt.logs.map((l) => R.sys.market.interface.parseLog(l)).filter((e) => e && e.name === "UnitSetAside")
    .map((e) => ({ round: e.args.round, unit: e.args.unit, unitId: e.args.unitId }));
}

const timestampOf = async (tx) => BigInt((await ethers.provider.getBlock((await tx.wait()).blockNumber)).timestamp);

/** Checks the step `tx` set aside unit `unit` of `round` as unit `unitId` with `verifiers`: its events and the
 * per-unit views of it (revealed, drawn, every replica's digest, verdict window open from the step, which
 * is one second after its reveal deadline). */
async function expectSetAside(R, tx, round, unit, unitId, verifiers) {
  const { market } = R.sys;
  const k = R.replicas;
  const at = (await timestampOf(tx)) - 1n; // its commit and reveal phases ended a second before the step
  const slots = Array.from({ length: k }, (_, r) => slotData(R, round, unit * k + r));
  await expect(tx).to.emit(market, "UnitSetAside").withArgs(R.orderId, round, unit, unitId);
  await expect(tx).to.emit(market, "UnitAssigned").withArgs(unitId, R.orderId, word(roundUnitIdOf(R.orderId, round, unit)),
    slots.map((d) => d.provider.address), addrsOf(verifiers), at);
  await expect(tx).to.emit(market, "VerificationRequested").withArgs(unitId);
  const u = await market.getUnit(unitId);
  const all = BigInt((1 << k) - 1);
  expect([u.orderId, u.state, u.replicas, u.verifierCount, u.committedMask, u.revealedMask, u.drawn, u.commitDeadline,
    u.revealDeadline, u.verdictDeadline]).to.deep.equal([R.orderId, h.UNIT_STATE.Revealing, BigInt(k),
    BigInt(verifiers.length), all, all, true, at, at, at + PARAMS.verdictWindow]);
  for (let r = 0; r < k; r++) {
    expect(await market.replicaOf(unitId, r)).to.deep.equal([slots[r].provider.address, slots[r].resultDigest, true, true]);
  }
  await expect(market.replicaOf(unitId, k)).to.be.revertedWithCustomError(market, "ReplicaIndexOutOfRange")
    .withArgs(unitId, k);
  expect(await market.verifiersOf(unitId)).to.deep.equal(addrsOf(verifiers));
  expect(await market.verdictHashOf(unitId)).to.equal(ethers.ZeroHash);
}

/** submitVerdict of `outcomes` signed by `signers`, relayed by a third party. */
async function verdict(sys, unitId, outcomes, signers) {
  const sigs = [];
  for (const v of signers) sigs.push(await h.signVerdict(sys.market, v, unitId, outcomes));
  return sys.market.connect(sys.other).submitVerdict(unitId, outcomes, sigs);
}

/** What the market ever owed `account`: its credit plus every payment to it (CreditWithdrawn: a withdrawal, or
 * a close paying it directly), so a check reads the same whether a close paid a party or credited it. */
async function earnedOf(market, account) {
  const paid = await market.queryFilter(market.filters.CreditWithdrawn(account));
  return (await market.credits(account)) + paid.reduce((sum, e) => sum + e.args.amount, 0n);
}

async function orderFields(sys, orderId) {
  const o = await sys.market.getOrder(orderId);
  return { balance: o.balance, delivered: o.delivered, openUnits: o.openUnits, closed: o.closed };
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
      const key = await market.rosterKey(R.addrs, R.layout, 3, 2, 3, []);
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
        committed: 0n, pendingBlock: 0n, pendingSince: 0n, replicas: 3n, closed: false, requiredStreak: 0n,
        setAsideUnits: 0n, openSetAside: 0n, pending: ethers.ZeroHash });
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
        await expect(tx).to.emit(market, "RoundRevealed").withArgs(orderId, round - 1, unitDigests(R, round - 1), 0n);
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
      await expect(tx3).to.emit(market, "RoundRevealed").withArgs(orderId, 2, unitDigests(R, 2), 0n);
      await expect(tx3).to.not.emit(market, "RoundCommitted");
      st = await rosterState(sys, orderId);
      expect([st.committed, st.pendingBlock, st.closed]).to.deep.equal([3n, 0n, false]);
      // nothing is paid before the close
      for (const p of [a, b, c]) expect(await market.credits(p.address)).to.equal(0n);
      expect(await market.totalCredits()).to.equal(0n);

      // close (anyone): each provider 2 slots x 3 rounds x PRICE
      const paidEach = 2n * 3n * PRICE;
      const tokensBefore = await Promise.all([a, b, c].map((p) => token.balanceOf(p.address)));
      const closed = closeTx(R);
      await expect(closed).to.emit(market, "RosterClosed").withArgs(orderId, 3, 3n * paidEach);
      for (const [i, p] of [a, b, c].entries()) {
        // paid by the close itself: nothing left to withdraw
        await expect(closed).to.emit(market, "CreditWithdrawn").withArgs(p.address, paidEach);
        expect(await token.balanceOf(p.address)).to.equal(tokensBefore[i] + paidEach);
        expect(await market.credits(p.address)).to.equal(0n);
        await expect(market.connect(p).withdrawCredit()).to.be.revertedWithCustomError(market, "NothingToWithdraw");
        expect(await market.reputationOf(p.address)).to.deep.equal([6n, 0n, 0n, 6n]);
        expect(await lockedOf(sys, p)).to.equal(0n);
        expect(await stakes.freeStake(p.address)).to.equal(200n * E18);
      }
      order = await market.getOrder(orderId);
      expect([order.balance, order.openUnits, order.delivered, order.closed]).to.deep.equal([6n * FEE, 0n, 6n, false]);
      expect((await rosterState(sys, orderId)).closed).to.equal(true);
      expect(await market.totalEscrow()).to.equal(6n * FEE);
      expect(await market.totalCredits()).to.equal(0n);
      await expectSolventLoose(sys);
      // a closed roster takes no step and no second close
      await expect(step(R, { reveal: null, commit: 0 })).to.be.revertedWithCustomError(market, "RosterNotOpen")
        .withArgs(orderId);
      await expect(closeTx(R)).to.be.revertedWithCustomError(market, "RosterNotOpen").withArgs(orderId);

      // the buyer gets the unused verifier fees back, paid by the close
      const buyerBefore = await token.balanceOf(buyer.address);
      const closedOrder = market.connect(buyer).closeOrder(orderId);
      await expect(closedOrder).to.emit(market, "OrderClosed").withArgs(orderId, 6n * FEE);
      await expect(closedOrder).to.emit(market, "CreditWithdrawn").withArgs(buyer.address, 6n * FEE);
      expect(await token.balanceOf(buyer.address)).to.equal(buyerBefore + 6n * FEE);
      expect(await market.credits(buyer.address)).to.equal(0n);
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
        expect(await earnedOf(market, R.addrs[p])).to.equal(uses[p] * 2n * PRICE);
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
      await expect(step(R, { reveal: 0, commit: 1 })).to.emit(market, "RoundRevealed").withArgs(orderId, 0, unitDigests(R, 0), 0n);
      await step(R, { reveal: 1 });
      await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 2, 4n * PRICE);
      expect(await earnedOf(market, a.address)).to.equal(2n * PRICE + 4n * PRICE); // 2 per-unit + 4 round units
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
      const key = await market.rosterKey(R.addrs, R.layout, 3, 2, 3, []);
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
      const key2 = await market.rosterKey(R2.addrs, R2.layout, 3, 2, 3, []);
      const replayed = [];
      for (let i = 0; i < 3; i++) replayed.push(await h.signAccept(market, R2.signers[i], second, key2, { nonce: accepts[i].nonce }));
      await expect(openTx(R2, replayed)).to.be.revertedWithCustomError(market, "AcceptNonceUsed").withArgs(a.address, accepts[0].nonce);
      // a provider without the free stake for its slots (3 slots a round: 300 > 400 bonded - 200 locked)
      const R3 = rosterOf(sys, second, [a, b, c], { unitsPerRound: 3, rounds: 1 });
      await expect(openRoster(R3)).to.be.revertedWithCustomError(sys.stakes, "InsufficientFreeStake");
      await expect(openRoster(R2)).to.emit(market, "RosterOpened");
      await expectSolventLoose(sys);
    });

    it("takes a provider on probation (probationStreak 1): each of its units is set aside, verified and paid by verdict",
      async function () {
      const sys = await h.fundedSystem({ ...PARAMS, probationStreak: 1 });
      const { market, stakes } = sys;
      const [a, b, c, d] = sys.providers;
      const [v1, v2] = sys.verifiers;
      const { orderId } = await h.postOrder(sys, { units: 8 });
      // a, b, c leave probation with one per-unit unit (drawn: probation), accepted by a verdict; d stays new
      const first = await h.assignUnit(sys, orderId);
      const same = first.providers.map(() => h.digestOf("same"));
      await h.commitAll(sys, first.unitId, first.providers, same);
      await h.revealAll(sys, first.unitId, first.providers, same);
      await verdict(sys, first.unitId, [0, 0, 0], [v1, v2]);
      for (const p of [a, b, c]) expect(await market.reputationOf(p.address)).to.deep.equal([1n, 0n, 0n, 1n]);
      expect(await market.reputationOf(d.address)).to.deep.equal([0n, 0n, 0n, 0n]);

      // unit 0: a b c, unit 1: a b d. The roster takes d on probation (no ProviderNotTrusted any more)
      const R = rosterOf(sys, orderId, [a, b, c, d], { slots: [0, 1, 2, 0, 1, 3], rounds: 3 });
      await expect(openRoster(R)).to.emit(market, "RosterOpened").withArgs(orderId, R.addrs, R.layout, 3, 2, 3);
      expect(await lockedOf(sys, d)).to.equal(COLLATERAL);
      expect(await rosterState(sys, orderId)).to.include({ requiredStreak: 1n, setAsideUnits: 0n, openSetAside: 0n });
      await step(R, { commit: 0 });
      // round 0: d's unit needs a verdict: refused to anyone but the operator with verifiers
      await expect(step(R, { reveal: 0, commit: 1, verifiers: [v1, v2] }))
        .to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict").withArgs(orderId, 0, 1, true);
      await expect(opStep(R, [], { reveal: 0, commit: 1 }))
        .to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict").withArgs(orderId, 0, 1, true);
      const tx0 = await opStep(R, [v1, v2], { reveal: 0, commit: 1 });
      await expect(tx0).to.emit(market, "RoundRevealed").withArgs(orderId, 0, unitDigests(R, 0), 0n);
      await expectSetAside(R, tx0, 0, 1, 2n, [v1, v2]);
      expect(await setAsideOf(R, tx0)).to.deep.equal([{ round: 0n, unit: 1n, unitId: 2n }]); // unit 0 (a b c) is not
      // round 1 revealed before that verdict: d is still on probation, its unit is set aside again. c, a roster
      // provider outside unit 1, may verify it; a, one of its providers, may not
      await expect(opStep(R, [v1, a], { reveal: 1, commit: 2 }))
        .to.be.revertedWithCustomError(market, "DuplicateParty").withArgs(a.address);
      const tx1 = await opStep(R, [v1, c], { reveal: 1, commit: 2 });
      await expectSetAside(R, tx1, 1, 1, 3n, [v1, c]);
      expect(await setAsideOf(R, tx1)).to.deep.equal([{ round: 1n, unit: 1n, unitId: 3n }]);
      expect(await rosterState(sys, orderId)).to.include({ committed: 3n, setAsideUnits: 2n, openSetAside: 2n });
      expect(await lockedOf(sys, v1)).to.equal(2n * PARAMS.verifierCollateral);
      expect(await lockedOf(sys, c)).to.equal(COLLATERAL + PARAMS.verifierCollateral);

      // both verified: every replica accepted and paid by its verdict; d is off probation
      await verdict(sys, 2n, [0, 0, 0], [v1, v2]);
      await verdict(sys, 3n, [0, 0, 0], [c, v1]);
      expect(await market.reputationOf(d.address)).to.deep.equal([2n, 0n, 0n, 2n]);
      expect(await earnedOf(market, d.address)).to.equal(2n * PRICE);
      expect(await lockedOf(sys, d)).to.equal(COLLATERAL); // the roster's, until it closes
      expect(await lockedOf(sys, c)).to.equal(COLLATERAL);
      for (const v of [v1, v2]) expect(await lockedOf(sys, v)).to.equal(0n);
      expect(await rosterState(sys, orderId)).to.include({ setAsideUnits: 2n, openSetAside: 0n });
      // round 2: nobody below the streak now, anyone reveals it with no verifiers
      const tx2 = await step(R, { reveal: 2 });
      await expect(tx2).to.emit(market, "RoundRevealed").withArgs(orderId, 2, unitDigests(R, 2), 0n);
      await expect(tx2).to.not.emit(market, "UnitSetAside");

      // close: 6 units x 3 slots, 6 of them set aside and paid by verdict
      await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 3, 12n * PRICE);
      // a, b: 1 per-unit + 2 set aside + 4 roster; c: 1 per-unit + 3 roster (+ half a fee); d: 2 set aside + 1 roster
      for (const p of [a, b]) {
        expect(await earnedOf(market, p.address)).to.equal(7n * PRICE);
        expect(await market.reputationOf(p.address)).to.deep.equal([7n, 0n, 0n, 7n]);
      }
      expect(await earnedOf(market, c.address)).to.equal(4n * PRICE + FEE / 2n);
      expect(await market.reputationOf(c.address)).to.deep.equal([4n, 0n, 0n, 4n]);
      expect(await earnedOf(market, d.address)).to.equal(3n * PRICE);
      expect(await market.reputationOf(d.address)).to.deep.equal([3n, 0n, 0n, 3n]);
      expect(await earnedOf(market, v1.address)).to.equal(3n * FEE / 2n);
      expect(await earnedOf(market, v2.address)).to.equal(FEE);
      for (const p of [a, b, c, d]) expect(await stakes.stakeOf(p.address)).to.deep.equal([200n * E18, 0n, 0n, 0n]);
      // the order: 1 per-unit unit + 6 round units delivered; the roster's 4 own units' fees come back
      expect(await orderFields(sys, orderId)).to.deep.equal(
        { balance: 3n * PRICE + FEE + 4n * FEE, delivered: 7n, openUnits: 0n, closed: false });
      await expect(market.connect(sys.buyer).closeOrder(orderId)).to.emit(market, "OrderClosed")
        .withArgs(orderId, 3n * PRICE + 5n * FEE);
      expect(await market.totalEscrow()).to.equal(0n);
      await expectSolventLoose(sys);
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
      await expect(market.stepRound(orderId, R.addrs, R.layout, [], 0, [], 0, NO_WORK, NO_AUDIT)).to.be.revertedWithCustomError(market, "EmptyBatch");
      // nothing pending: openings alone are nothing to do (they are ignored, see the copied-reveal test)
      await expect(market.stepRound(orderId, R.addrs, R.layout, openingsFor(R, 0), 0, [], 0, NO_WORK, NO_AUDIT))
        .to.be.revertedWithCustomError(market, "EmptyBatch");
      const { works, deadline } = await worksFor(R, 0);
      await expect(market.stepRound(orderId, R.addrs, R.layout, [], 0, [], deadline,
        { ...works, commitments: works.commitments.slice(0, 5) }, NO_AUDIT))
        .to.be.revertedWithCustomError(market, "EntryCountMismatch").withArgs(6, 5);
      // one signature per roster provider, no fewer
      await expect(market.stepRound(orderId, R.addrs, R.layout, [], 0, [], deadline,
        { ...works, signatures: works.signatures.slice(0, 2) }, NO_AUDIT))
        .to.be.revertedWithCustomError(market, "EntryCountMismatch").withArgs(3, 2);
      await market.stepRound(orderId, R.addrs, R.layout, [], 0, [], deadline, works, NO_AUDIT);
      // pending: its openings are required, all of them
      const next = await worksFor(R, 1);
      await expect(market.stepRound(orderId, R.addrs, R.layout, [], 0, [], next.deadline, next.works, NO_AUDIT))
        .to.be.revertedWithCustomError(market, "EntryCountMismatch").withArgs(6, 0);
      await expect(market.stepRound(orderId, R.addrs, R.layout, openingsFor(R, 0).slice(1), 0, [], 0, NO_WORK, NO_AUDIT))
        .to.be.revertedWithCustomError(market, "EntryCountMismatch").withArgs(6, 5);
    });

    it("refuses a forged work signature and an expired one", async function () {
      const { sys, R } = await load(openedFixture);
      const { market, other } = sys;
      await expect(step(R, { commit: 0, signerAt: (p) => (p === 1 ? other : undefined) }))
        .to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(R.addrs[1], other.address);
      const past = (await time.latest()) - 1n;
      await expect(step(R, { commit: 0, deadline: past })).to.be.revertedWithCustomError(market, "SignatureExpired")
        .withArgs(past, anyValue);
      // a malformed compact signature recovers nobody
      const { works, deadline } = await worksFor(R, 0);
      works.signatures[0] = { ...works.signatures[0], r: ethers.ZeroHash };
      await expect(market.stepRound(R.orderId, R.addrs, R.layout, [], 0, [], deadline, works, NO_AUDIT))
        .to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(R.addrs[0], ethers.ZeroAddress);
    });

    it("refuses a round signature replayed into another round or another order, or over another provider's slots",
      async function () {
      const { sys, orderId, R } = await load(openedFixture);
      const { market } = sys;
      // a provider's signature covers its own slots, in slot order: not another provider's, not reordered
      await expect(step(R, { commit: 0, slotsOf: (p) => (p === 0 ? [1, 4] : undefined) }))
        .to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(R.addrs[0], anyValue);
      await expect(step(R, { commit: 0, slotsOf: (p) => (p === 2 ? [5, 2] : undefined) }))
        .to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(R.addrs[2], anyValue);
      const own = await worksFor(R, 0);
      const swappedSigs = [own.works.signatures[1], own.works.signatures[0], own.works.signatures[2]];
      await expect(market.stepRound(orderId, R.addrs, R.layout, [], 0, [], own.deadline, { ...own.works, signatures: swappedSigs },
        NO_AUDIT)).to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(R.addrs[0], anyValue);
      // provider 0's slots' commitments swapped with each other: its signature no longer matches
      const c = own.works.commitments;
      const swappedSlots = [c[3], c[1], c[2], c[0], c[4], c[5]];
      await expect(market.stepRound(orderId, R.addrs, R.layout, [], 0, [], own.deadline, { ...own.works, commitments: swappedSlots },
        NO_AUDIT)).to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(R.addrs[0], anyValue);
      // the signatures name another order
      await expect(step(R, { commit: 0, orderSigned: BigInt(orderId) + 1n }))
        .to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(R.addrs[0], anyValue);
      // round 1's commitments signed as round 0's
      await step(R, { commit: 0 });
      await expect(step(R, { reveal: 0, commit: 1, roundSigned: 0 })).to.be.revertedWithCustomError(market, "InvalidSigner")
        .withArgs(R.addrs[0], anyValue);
      // round 0's very works (same commitments, same signatures) resent for round 1
      const again = { ...R, digests: {} };
      const round0 = await worksFor(again, 0);
      await expect(market.stepRound(orderId, R.addrs, R.layout, openingsFor(R, 0), 0, [], round0.deadline, round0.works, NO_AUDIT))
        .to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(R.addrs[0], anyValue);
      // another order with the same providers and shape: order 1's round 0 works do not pass for it
      for (const p of R.signers) await sys.stakes.connect(p).stake(200n * E18);
      const second = (await h.postOrder(sys, { units: 6 })).orderId;
      const R2 = rosterOf(sys, second, R.signers);
      await openRoster(R2);
      await expect(market.stepRound(second, R2.addrs, R2.layout, [], 0, [], round0.deadline, round0.works, NO_AUDIT))
        .to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(R.addrs[0], anyValue);
      await expect(step(R2, { commit: 0 })).to.emit(market, "RoundCommitted").withArgs(second, 0);
    });

    it("refuses openings that do not match the round's commitments (RoundHashMismatch)", async function () {
      const { sys, orderId, R } = await load(committedFixture);
      const { market } = sys;
      const good = openingsFor(R, 0);
      const badSalt = good.map((o, i) => (i === 2 ? { ...o, salt: h.saltOf("other") } : o));
      await expect(market.stepRound(orderId, R.addrs, R.layout, badSalt, 0, [], 0, NO_WORK, NO_AUDIT)).to.be.revertedWithCustomError(market,
        "RoundHashMismatch").withArgs(orderId, 0);
      // a changed digest, even the same one for the whole unit
      const badDigest = good.map((o, i) => (i < 3 ? { ...o, resultDigest: h.digestOf("forged") } : o));
      await expect(market.stepRound(orderId, R.addrs, R.layout, badDigest, 0, [], 0, NO_WORK, NO_AUDIT)).to.be.revertedWithCustomError(market,
        "RoundHashMismatch").withArgs(orderId, 0);
      // the right openings in another slot order
      const swapped = [good[1], good[0], ...good.slice(2)];
      await expect(market.stepRound(orderId, R.addrs, R.layout, swapped, 0, [], 0, NO_WORK, NO_AUDIT)).to.be.revertedWithCustomError(market,
        "RoundHashMismatch").withArgs(orderId, 0);
      await expect(market.stepRound(orderId, R.addrs, R.layout, good, 0, [], 0, NO_WORK, NO_AUDIT)).to.emit(market, "RoundRevealed");
    });

    it("a non-unanimous unit needs the operator with verifiers (RoundUnitNeedsVerdict drawn=false); not set aside, the round stays pending and unpaid",
      async function () {
      const { sys, orderId, deadline, R } = await load(openedFixture);
      const { market } = sys;
      const [v1, v2] = sys.verifiers;
      const digests = R.slots.map((_, i) => h.digestOf(`u${Math.floor(i / 3)}`));
      digests[4] = h.digestOf("dissent"); // unit 1, replica 1
      await step(R, { commit: 0, digests });
      const pendingBefore = await chainState(sys, orderId);
      await expect(step(R, { reveal: 0, commit: 1 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
        .withArgs(orderId, 0, 1, false);
      await expect(step(R, { reveal: 0 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
        .withArgs(orderId, 0, 1, false);
      // verifiers from anyone but the operator, and the operator without enough verifiers, are refused alike
      await expect(step(R, { reveal: 0, verifiers: [v1, v2] })).to.be.revertedWithCustomError(market,
        "RoundUnitNeedsVerdict").withArgs(orderId, 0, 1, false);
      await expect(opStep(R, [], { reveal: 0 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
        .withArgs(orderId, 0, 1, false);
      await expect(opStep(R, [v1], { reveal: 0 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
        .withArgs(orderId, 0, 1, false);
      expect(await chainState(sys, orderId)).to.deep.equal(pendingBefore);
      // the operator with verifiers would set it aside (see "set-aside units"); nobody does here
      await market.connect(sys.operator).stepRound.staticCall(orderId, R.addrs, R.layout, openingsFor(R, 0), 0,
        [v1.address, v2.address], 0, NO_WORK, NO_AUDIT);
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

    it("a drawn unit (spotCheckPpm 1e6) needs the operator with verifiers (drawn=true), who sets it aside; k=1 is drawn at the solo rate",
      async function () {
      const sys = await h.fundedSystem({ ...PARAMS, spotCheckPpm: 1_000_000 });
      const { market } = sys;
      const [v1, v2] = sys.verifiers;
      const { orderId } = await h.postOrder(sys, { units: 6 });
      const R = rosterOf(sys, orderId, sys.providers.slice(0, 3));
      await openRoster(R);
      await step(R, { commit: 0 });
      const before = await chainState(sys, orderId);
      await expect(step(R, { reveal: 0 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
        .withArgs(orderId, 0, 0, true);
      await expect(step(R, { reveal: 0, verifiers: [v1, v2] })).to.be.revertedWithCustomError(market,
        "RoundUnitNeedsVerdict").withArgs(orderId, 0, 0, true);
      await expect(opStep(R, [v1], { reveal: 0 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
        .withArgs(orderId, 0, 0, true);
      expect(await chainState(sys, orderId)).to.deep.equal(before);
      // the operator with verifiers: both units drawn, both set aside (ids 1, 2), the round revealed
      const tx = await opStep(R, [v1, v2], { reveal: 0 });
      await expect(tx).to.emit(market, "RoundRevealed").withArgs(orderId, 0, unitDigests(R, 0), 0n);
      await expectSetAside(R, tx, 0, 0, 1n, [v1, v2]);
      await expectSetAside(R, tx, 0, 1, 2n, [v1, v2]);
      expect(await rosterState(sys, orderId)).to.include({ committed: 1n, pendingBlock: 0n, setAsideUnits: 2n,
        openSetAside: 2n });
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
      const tx2 = await opStep(S2, sys2.verifiers.slice(0, 2), { reveal: 0 });
      await expectSetAside(S2, tx2, 0, 0, 1n, sys2.verifiers.slice(0, 2));
      expect(await rosterState(sys2, solo2)).to.include({ setAsideUnits: 1n, openSetAside: 1n });
    });

    it("a round left pending for more than 256 blocks (seed gone): every unit drawn, set aside only by the operator with verifiers",
      async function () {
      const { sys, orderId, R } = await load(committedFixture);
      const { market } = sys;
      const [v1, v2, v3] = sys.verifiers;
      await network.provider.send("hardhat_mine", ["0x101"]);
      const before = await chainState(sys, orderId);
      await expect(step(R, { reveal: 0 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
        .withArgs(orderId, 0, 0, true);
      await expect(opStep(R, [], { reveal: 0 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
        .withArgs(orderId, 0, 0, true);
      expect(await chainState(sys, orderId)).to.deep.equal(before);
      const tx = await opStep(R, [v1, v2, v3], { reveal: 0, commit: 1 });
      await expect(tx).to.emit(market, "RoundRevealed").withArgs(orderId, 0, unitDigests(R, 0), 0n);
      await expect(tx).to.emit(market, "RoundCommitted").withArgs(orderId, 1);
      expect(await setAsideOf(R, tx)).to.deep.equal([{ round: 0n, unit: 0n, unitId: 1n }, { round: 0n, unit: 1n, unitId: 2n }]);
      await expectSetAside(R, tx, 0, 0, 1n, [v1, v2, v3]);
      await expectSetAside(R, tx, 0, 1, 2n, [v1, v2, v3]);
      expect(await rosterState(sys, orderId)).to.include({ committed: 2n, setAsideUnits: 2n, openSetAside: 2n });
      for (const v of [v1, v2, v3]) expect(await lockedOf(sys, v)).to.equal(2n * PARAMS.verifierCollateral);
      for (const p of R.signers) expect(await lockedOf(sys, p)).to.equal(2n * COLLATERAL); // unchanged
      // the next round, revealed in time, is not set aside
      await expect(step(R, { reveal: 1 })).to.emit(market, "RoundRevealed").and.not.to.emit(market, "UnitSetAside");
      await expectSolventLoose(sys);
    });

    it("refuses a reveal in the block that committed the round (RoundRevealTooEarly)", async function () {
      const { sys, orderId, R } = await load(openedFixture);
      const { market } = sys;
      const { works, deadline } = await worksFor(R, 0);
      const commit = market.interface.encodeFunctionData("stepRound", [orderId, R.addrs, R.layout, [], 0, [], deadline, works, NO_AUDIT]);
      const reveal = market.interface.encodeFunctionData("stepRound", [orderId, R.addrs, R.layout, openingsFor(R, 0), 0, [], 0, NO_WORK, NO_AUDIT]);
      const nextBlock = BigInt(await ethers.provider.getBlockNumber()) + 1n;
      await expect(market.connect(sys.other).multicall([commit, reveal])).to.be.revertedWithCustomError(market,
        "RoundRevealTooEarly").withArgs(orderId, nextBlock);
      const seedBlock = (await (await market.connect(sys.other).multicall([commit])).wait()).blockNumber;
      await expect(market.stepRound.staticCall(orderId, R.addrs, R.layout, openingsFor(R, 0), 0, [], 0, NO_WORK, NO_AUDIT, { blockTag: seedBlock }))
        .to.be.revertedWithCustomError(market, "RoundRevealTooEarly").withArgs(orderId, seedBlock);
      // two transactions in one block (automine off): the reveal fails, the commit stands
      const R2 = { ...R, digests: {} };
      await step(R2, { reveal: 0 });
      const next = await worksFor(R2, 1);
      await network.provider.send("evm_setAutomine", [false]);
      try {
        const commitTx = await market.connect(sys.other).stepRound(orderId, R.addrs, R.layout, [], 0, [], next.deadline, next.works, NO_AUDIT,
          { gasLimit: 2_000_000 });
        const revealTx = await market.connect(sys.other).stepRound(orderId, R.addrs, R.layout, openingsFor(R2, 1), 0, [], 0, NO_WORK, NO_AUDIT,
          { gasLimit: 2_000_000 });
        await network.provider.send("evm_mine", []);
        expect((await commitTx.wait()).status).to.equal(1);
        await expect(revealTx.wait()).to.be.rejected;
      } finally {
        await network.provider.send("evm_setAutomine", [true]);
      }
      expect((await rosterState(sys, orderId)).committed).to.equal(2n);
      await expect(step(R2, { reveal: 1 })).to.emit(market, "RoundRevealed").withArgs(orderId, 1, unitDigests(R2, 1), 0n);
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
      await expect(market.stepRound(late, L.addrs, L.layout, openingsFor(L, 0), 0, [], far, next.works, NO_AUDIT))
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
      await expect(market.closeRoster(orderId, R.addrs, layoutOf([1, 2, 0, 1, 2, 0]), [], []))
        .to.be.revertedWithCustomError(market, "RosterMismatch").withArgs(orderId);
      const none = (await h.postOrder(sys, { units: 1 })).orderId;
      await expect(market.closeRoster(none, R.addrs, R.layout, [], [])).to.be.revertedWithCustomError(market, "RosterNotOpen")
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
        expect(await earnedOf(market, p.address)).to.equal(2n * PRICE);
        expect(await market.reputationOf(p.address)).to.deep.equal([2n, 0n, 0n, 2n]);
        expect(await lockedOf(sys, p)).to.equal(0n);
      }
      const order = await market.getOrder(orderId);
      expect([order.balance, order.delivered, order.openUnits]).to.deep.equal([ESCROW - paid, 2n, 0n]);
      expect(await rosterState(sys, orderId)).to.include({ committed: 2n, closed: true });
      // the pending round can no longer be revealed
      await expect(step(R, { reveal: 1 })).to.be.revertedWithCustomError(market, "RosterNotOpen").withArgs(orderId);
      await expect(market.connect(sys.other).closeOrder(orderId)).to.emit(market, "OrderClosed").withArgs(orderId, ESCROW - paid);
      expect(await earnedOf(market, sys.buyer.address)).to.equal(ESCROW - paid);
      expect(await market.totalEscrow()).to.equal(0n);
      expect(await market.totalCredits()).to.equal(0n); // the closes paid the providers and the buyer
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
      await expect(market.connect(sys.buyer).closeRoster(orderId, R.addrs, R.layout, [], []))
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
      await market.connect(sys.other).stepRound(orderId, R.addrs, R.layout, openingsFor(R, 0), 0, [], 0, NO_WORK, NO_AUDIT);
      // ... and the relayer's reveal-and-commit still commits round 1
      await expect(market.stepRound(orderId, R.addrs, R.layout, openingsFor(R, 0), 0, [], deadline, works, NO_AUDIT))
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
    it("the closes pay each party directly; a recipient the token refuses (revert or false) keeps a credit and " +
      "blocks nobody", async function () {
      const sys = await h.fundedSystem(PARAMS, "RefusingToken");
      const { market, token, buyer } = sys;
      const { orderId } = await h.postOrder(sys, { units: UNITS });
      const R = { ...rosterOf(sys, orderId, sys.providers.slice(0, 3)), digests: {} };
      const [a, b, c] = R.signers;
      await openRoster(R);
      await step(R, { commit: 0 });
      await step(R, { reveal: 0, commit: 1 });
      await step(R, { reveal: 1, commit: 2 });
      await step(R, { reveal: 2 });
      await token.refuse(a.address, 1); // reverts
      await token.refuse(b.address, 2); // returns false
      const paidEach = 2n * 3n * PRICE;
      const before = await Promise.all([a, b, c].map((p) => token.balanceOf(p.address)));
      const closed = closeTx(R);
      await expect(closed).to.emit(market, "RosterClosed").withArgs(orderId, 3, 3n * paidEach);
      await expect(closed).to.emit(market, "CreditKept").withArgs(a.address, paidEach);
      await expect(closed).to.emit(market, "CreditKept").withArgs(b.address, paidEach);
      await expect(closed).to.emit(market, "CreditWithdrawn").withArgs(c.address, paidEach);
      expect(await Promise.all([a, b, c].map((p) => token.balanceOf(p.address))))
        .to.deep.equal([before[0], before[1], before[2] + paidEach]);
      expect(await Promise.all([a, b, c].map((p) => market.credits(p.address)))).to.deep.equal([paidEach, paidEach, 0n]);
      expect(await market.totalCredits()).to.equal(2n * paidEach);
      await expectSolventLoose(sys);
      // a refused buyer's refund is kept likewise; the order closes
      await token.refuse(buyer.address, 1);
      const closedOrder = market.connect(buyer).closeOrder(orderId);
      await expect(closedOrder).to.emit(market, "OrderClosed").withArgs(orderId, 6n * FEE);
      await expect(closedOrder).to.emit(market, "CreditKept").withArgs(buyer.address, 6n * FEE);
      expect(await market.credits(buyer.address)).to.equal(6n * FEE);
      await expectSolventLoose(sys);
      // each withdraws its credit once the token takes it: paid once in all
      await expect(market.connect(a).withdrawCredit()).to.be.revertedWith("refused");
      for (const p of [a, b, buyer]) await token.refuse(p.address, 0);
      await expect(market.connect(a).withdrawCredit()).to.changeTokenBalance(token, a, paidEach);
      await expect(market.connect(b).withdrawCredit()).to.changeTokenBalance(token, b, paidEach);
      await expect(market.connect(buyer).withdrawCredit()).to.changeTokenBalance(token, buyer, 6n * FEE);
      for (const p of [a, b, c, buyer]) {
        await expect(market.connect(p).withdrawCredit()).to.be.revertedWithCustomError(market, "NothingToWithdraw");
      }
      expect([await market.totalEscrow(), await market.totalCredits()]).to.deep.equal([0n, 0n]);
      expect(await token.balanceOf(await market.getAddress())).to.equal(0n);
      await expectSolventLoose(sys);
    });
  });

  describe("set-aside units (a unit that needs a verdict settles on the per-unit path)", function () {
    const SPOT = 500_000; // half the units drawn: commitDrawing picks the block that draws the pattern a test needs

    it("a drawn unanimous unit: set aside, accepted by every verifier, paid by its verdict; the roster pays its other slots at close",
      async function () {
      const sys = await h.fundedSystem({ ...PARAMS, spotCheckPpm: SPOT });
      const { market, stakes, buyer } = sys;
      const [v1, v2, v3] = sys.verifiers;
      const { orderId } = await h.postOrder(sys, { units: 4 });
      const R = rosterOf(sys, orderId, sys.providers.slice(0, 3), { rounds: 2 });
      const [a, b, c] = R.signers;
      await openRoster(R);
      // round 0 draws unit 0 only; round 1 draws nothing
      await commitDrawing(R, 0, SPOT, [true, false], () => step(R, { commit: 0 }));
      await expect(step(R, { reveal: 0, commit: 1, verifiers: [v1, v2, v3] })).to.be.revertedWithCustomError(market,
        "RoundUnitNeedsVerdict").withArgs(orderId, 0, 0, true);
      const unitId = (await market.unitCount()) + 1n;
      const tx = await commitDrawing(R, 1, SPOT, [false, false], () => opStep(R, [v1, v2, v3], { reveal: 0, commit: 1 }));
      await expect(tx).to.emit(market, "RoundRevealed").withArgs(orderId, 0, unitDigests(R, 0), 0n);
      await expect(tx).to.emit(market, "RoundCommitted").withArgs(orderId, 1);
      await expectSetAside(R, tx, 0, 0, unitId, [v1, v2, v3]);
      expect(await setAsideOf(R, tx)).to.deep.equal([{ round: 0n, unit: 0n, unitId }]);
      expect(await market.unitCount()).to.equal(unitId);
      expect(await rosterState(sys, orderId)).to.include({ committed: 2n, setAsideUnits: 1n, openSetAside: 1n });
      // nothing moved in the order: the roster reserved the unit's budget at open and the unit keeps it
      expect(await orderFields(sys, orderId)).to.deep.equal({ balance: 0n, delivered: 0n, openUnits: 4n, closed: false });
      for (const v of [v1, v2, v3]) expect(await lockedOf(sys, v)).to.equal(PARAMS.verifierCollateral);
      for (const p of [a, b, c]) expect(await lockedOf(sys, p)).to.equal(2n * COLLATERAL);
      // a set-aside unit is drawn: no fast path for it
      await expect(market.connect(sys.operator).finalize(unitId)).to.be.revertedWithCustomError(market,
        "UnitUnderVerification").withArgs(unitId);
      await expectSolventLoose(sys);

      // round 1 revealed by anyone (nothing drawn); every round revealed, but the set-aside unit is open
      const tx1 = await step(R, { reveal: 1 });
      await expect(tx1).to.emit(market, "RoundRevealed").withArgs(orderId, 1, unitDigests(R, 1), 0n);
      await expect(tx1).to.not.emit(market, "UnitSetAside");
      await expect(closeTx(R)).to.be.revertedWithCustomError(market, "UnitsStillOpen").withArgs(orderId, 1);
      await expect(market.connect(buyer).closeOrder(orderId)).to.be.revertedWithCustomError(market, "UnitsStillOpen")
        .withArgs(orderId, 4);

      // every verifier accepts every replica: providers paid their price by the verdict, verifiers split the fee
      const vtx = await verdict(sys, unitId, [0, 0, 0], [v1, v2, v3]);
      await expect(vtx).to.emit(market, "VerdictRecorded")
        .withArgs(unitId, [0, 0, 0], h.outcomesHashOf([0, 0, 0]), [v1.address, v2.address, v3.address]);
      await expect(vtx).to.not.emit(market, "FraudHeld");
      expect((await market.getUnit(unitId)).state).to.equal(h.UNIT_STATE.Verdicted);
      for (const p of [a, b, c]) {
        expect(await earnedOf(market, p.address)).to.equal(PRICE);
        expect(await market.reputationOf(p.address)).to.deep.equal([1n, 0n, 0n, 1n]);
        expect(await lockedOf(sys, p)).to.equal(2n * COLLATERAL); // still the roster's
      }
      for (const v of [v1, v2, v3]) {
        expect(await earnedOf(market, v.address)).to.equal(FEE / 3n);
        expect(await lockedOf(sys, v)).to.equal(0n);
      }
      expect(await rosterState(sys, orderId)).to.include({ setAsideUnits: 1n, openSetAside: 0n, closed: false });
      expect(await orderFields(sys, orderId)).to.deep.equal({ balance: 0n, delivered: 1n, openUnits: 3n, closed: false });
      expect(await market.totalCredits()).to.equal(3n * PRICE + FEE);
      await expectSolventLoose(sys);

      // close: the roster's other 3 units (9 slots) only; each provider 3 roster slots + 1 paid by the verdict
      await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 2, 9n * PRICE);
      for (const p of [a, b, c]) {
        expect(await earnedOf(market, p.address)).to.equal(4n * PRICE);
        expect(await market.reputationOf(p.address)).to.deep.equal([4n, 0n, 0n, 4n]);
        expect(await stakes.stakeOf(p.address)).to.deep.equal([200n * E18, 0n, 0n, 0n]);
      }
      // every unit delivered once: 1 by its verdict, 3 by the roster; the roster's 3 units' fees come back
      expect(await orderFields(sys, orderId)).to.deep.equal({ balance: 3n * FEE, delivered: 4n, openUnits: 0n, closed: false });
      expect(await rosterState(sys, orderId)).to.include({ closed: true, setAsideUnits: 1n, openSetAside: 0n });
      await expect(market.connect(buyer).closeOrder(orderId)).to.emit(market, "OrderClosed").withArgs(orderId, 3n * FEE);
      expect(await earnedOf(market, buyer.address)).to.equal(3n * FEE);
      expect(await market.totalEscrow()).to.equal(0n);
      // the closes paid the providers and the buyer: the set-aside unit's verifiers' fee is left to withdraw
      expect(await market.totalCredits()).to.equal(FEE);
      await expectSolventLoose(sys);
    });

    it("a split unit: set aside, verdict accept/accept/fraud holds the fraud; the roster closes only once VerdictAppeals settled it",
      async function () {
      const { sys, orderId, R } = await load(openedFixture);
      const { market, stakes, buyer } = sys;
      const appeals = await h.deployAppeals(sys);
      const [a, b, c] = R.signers;
      const [v1, v2, v3] = sys.verifiers;
      const digests = R.slots.map((_, i) => h.digestOf(`r0u${Math.floor(i / 3)}`));
      digests[5] = h.digestOf("cheat"); // unit 1, replica 2: c
      await step(R, { commit: 0, digests });
      await expect(step(R, { reveal: 0, commit: 1 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
        .withArgs(orderId, 0, 1, false);
      const tx = await opStep(R, [v1, v2, v3], { reveal: 0, commit: 1 });
      await expect(tx).to.emit(market, "RoundRevealed").withArgs(orderId, 0, unitDigests(R, 0), 0n);
      await expectSetAside(R, tx, 0, 1, 1n, [v1, v2, v3]);
      expect((await market.replicaOf(1n, 2))[1]).to.equal(h.digestOf("cheat"));
      expect(await setAsideOf(R, tx)).to.deep.equal([{ round: 0n, unit: 1n, unitId: 1n }]);

      // two of three verifiers: a and b accepted, c fraud (held)
      const FRAUD_VERDICT = [0, 0, 2];
      const vtx = await verdict(sys, 1n, FRAUD_VERDICT, [v1, v2]);
      await expect(vtx).to.emit(market, "FraudHeld").withArgs(1n, 4);
      const [mask, since] = await market.heldOf(1n);
      expect([mask, since]).to.deep.equal([4n, await timestampOf(vtx)]);
      for (const p of [a, b]) {
        expect(await earnedOf(market, p.address)).to.equal(PRICE);
        expect(await market.reputationOf(p.address)).to.deep.equal([1n, 0n, 0n, 1n]);
      }
      expect(await earnedOf(market, c.address)).to.equal(0n);
      expect(await market.reputationOf(c.address)).to.deep.equal([0n, 0n, 1n, 0n]);
      for (const v of [v1, v2]) expect(await earnedOf(market, v.address)).to.equal(FEE / 2n);
      for (const v of [v1, v2, v3]) expect(await lockedOf(sys, v)).to.equal(0n);
      for (const p of [a, b, c]) expect(await lockedOf(sys, p)).to.equal(2n * COLLATERAL);
      expect(await rosterState(sys, orderId)).to.include({ setAsideUnits: 1n, openSetAside: 1n }); // fraud held
      expect(await orderFields(sys, orderId)).to.deep.equal({ balance: 0n, delivered: 1n, openUnits: 5n, closed: false });

      // the other rounds go on; the close waits for the held fraud
      await step(R, { reveal: 1, commit: 2 });
      await step(R, { reveal: 2 });
      await expect(closeTx(R)).to.be.revertedWithCustomError(market, "UnitsStillOpen").withArgs(orderId, 1);
      await expect(appeals.settleVerdict(1n, FRAUD_VERDICT)).to.be.revertedWithCustomError(appeals, "TruthNotFixed")
        .withArgs(1n);
      await time.increaseTo(since + h.APPEAL_PARAMS.appealWindow + 1n);
      const stx = appeals.connect(sys.other).settleVerdict(1n, FRAUD_VERDICT);
      await expect(stx).to.emit(market, "ReplicaSlashed").withArgs(1n, c.address, PARAMS.slashAmount);
      await expect(stx).to.emit(market, "HeldSettled").withArgs(1n, FRAUD_VERDICT);
      const bounty = PARAMS.slashAmount * BigInt(PARAMS.bountyBps) / 10_000n;
      expect(await market.reputationOf(c.address)).to.deep.equal([0n, 0n, 1n, 0n]);
      // before the slash one slot's collateral of the roster's lock was released (as any unit's is), so the
      // slash (bonded 140) leaves the roster's other slot locked and never cuts into another lock
      expect(await stakes.stakeOf(c.address)).to.deep.equal([200n * E18 - PARAMS.slashAmount, COLLATERAL, 0n, 0n]);
      for (const v of [v1, v2]) expect(await earnedOf(market, v.address)).to.equal(FEE / 2n + bounty / 2n);
      expect(await earnedOf(market, v3.address)).to.equal(0n);
      expect(await earnedOf(market, buyer.address)).to.equal(PARAMS.slashAmount - bounty + PRICE);
      expect(await rosterState(sys, orderId)).to.include({ setAsideUnits: 1n, openSetAside: 0n });
      await expectSolventLoose(sys);

      // close: 5 units x 3 slots by the roster
      await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 3, 15n * PRICE);
      for (const p of [a, b]) {
        expect(await earnedOf(market, p.address)).to.equal(6n * PRICE);
        expect(await market.reputationOf(p.address)).to.deep.equal([6n, 0n, 0n, 6n]);
        expect(await stakes.stakeOf(p.address)).to.deep.equal([200n * E18, 0n, 0n, 0n]);
      }
      expect(await earnedOf(market, c.address)).to.equal(5n * PRICE); // its 5 other slots
      // c's 5 roster slots count valid but do not rebuild the streak its fraud ended (some were revealed
      // before the verdict: counting them after it would undo the catch)
      expect(await market.reputationOf(c.address)).to.deep.equal([5n, 0n, 1n, 0n]);
      expect(await stakes.stakeOf(c.address)).to.deep.equal([200n * E18 - PARAMS.slashAmount, 0n, 0n, 0n]);
      expect(await orderFields(sys, orderId)).to.deep.equal({ balance: 5n * FEE, delivered: 6n, openUnits: 0n, closed: false });
      await expect(market.connect(buyer).closeOrder(orderId)).to.emit(market, "OrderClosed").withArgs(orderId, 5n * FEE);
      expect(await earnedOf(market, buyer.address)).to.equal(5n * FEE + PARAMS.slashAmount - bounty + PRICE);
      expect(await market.totalEscrow()).to.equal(0n);
      // the closes paid the providers and the buyer: the set-aside unit's verifiers' fee and bounty are left
      expect(await market.totalCredits()).to.equal(FEE + bounty);
      await expectSolventLoose(sys);
    });

    it("a set-aside unit nobody settles expires after its verdict deadline: its budget returns to the order, unpaid",
      async function () {
      const { sys, orderId, R: R6 } = await load(orderFixture);
      const { market, buyer } = sys;
      const [v1, v2] = sys.verifiers;
      const R = { ...rosterOf(sys, orderId, R6.signers, { rounds: 1 }), digests: {} };
      await openRoster(R);
      const digests = R.slots.map((_, i) => h.digestOf(`u${Math.floor(i / 3)}`));
      digests[0] = h.digestOf("dissent"); // unit 0, replica 0
      await step(R, { commit: 0, digests });
      const tx = await opStep(R, [v1, v2], { reveal: 0 });
      await expectSetAside(R, tx, 0, 0, 1n, [v1, v2]);
      const { verdictDeadline } = await market.getUnit(1n);
      await expect(closeTx(R)).to.be.revertedWithCustomError(market, "UnitsStillOpen").withArgs(orderId, 1);
      await expect(market.expireUnit(1n)).to.be.revertedWithCustomError(market, "UnitNotExpired")
        .withArgs(1n, verdictDeadline);
      await time.increaseTo(verdictDeadline + 1n);
      await expect(verdict(sys, 1n, [0, 0, 0], [v1, v2])).to.be.revertedWithCustomError(market, "VerdictWindowClosed")
        .withArgs(1n, verdictDeadline);
      await expect(market.connect(sys.other).expireUnit(1n)).to.emit(market, "UnitExpired").withArgs(1n);
      expect((await market.getUnit(1n)).state).to.equal(h.UNIT_STATE.Expired);
      for (const v of [v1, v2]) {
        expect(await lockedOf(sys, v)).to.equal(0n);
        expect(await earnedOf(market, v.address)).to.equal(0n);
      }
      for (const p of R.signers) {
        expect(await lockedOf(sys, p)).to.equal(2n * COLLATERAL); // the roster's until it closes
        expect(await market.reputationOf(p.address)).to.deep.equal([0n, 0n, 0n, 0n]); // every replica revealed
      }
      expect(await rosterState(sys, orderId)).to.include({ setAsideUnits: 1n, openSetAside: 0n });
      // the unit's whole budget is the order's again
      expect(await orderFields(sys, orderId)).to.deep.equal(
        { balance: ESCROW - 2n * (3n * PRICE + FEE) + 3n * PRICE + FEE, delivered: 0n, openUnits: 1n, closed: false });

      await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 1, 3n * PRICE);
      for (const p of R.signers) {
        expect(await earnedOf(market, p.address)).to.equal(PRICE); // unit 1 only
        expect(await market.reputationOf(p.address)).to.deep.equal([1n, 0n, 0n, 1n]);
        expect(await lockedOf(sys, p)).to.equal(0n);
      }
      expect(await orderFields(sys, orderId)).to.deep.equal(
        { balance: ESCROW - 3n * PRICE, delivered: 1n, openUnits: 0n, closed: false });
      await expect(market.connect(buyer).closeOrder(orderId)).to.emit(market, "OrderClosed")
        .withArgs(orderId, ESCROW - 3n * PRICE);
      expect(await market.totalEscrow()).to.equal(0n);
      await expectSolventLoose(sys);
    });

    it("refuses a set-aside step from a non-operator or with bad verifiers; each refusal leaves the round pending",
      async function () {
      const { sys, orderId, R } = await load(openedFixture);
      const { market, stakes, other } = sys;
      const [v1, v2] = sys.verifiers;
      const digests = R.slots.map((_, i) => h.digestOf(`u${Math.floor(i / 3)}`));
      digests[3] = h.digestOf("dissent"); // unit 1, replica 0: a
      await step(R, { commit: 0, digests });
      const before = await chainState(sys, orderId);
      const [a] = R.signers;
      const extra = (await ethers.getSigners()).slice(11, 15);
      const refusals = [
        [() => step(R, { reveal: 0, commit: 1, verifiers: [v1, v2] }), "RoundUnitNeedsVerdict", [orderId, 0, 1, false]],
        [() => opStep(R, [], { reveal: 0, commit: 1 }), "RoundUnitNeedsVerdict", [orderId, 0, 1, false]],
        [() => opStep(R, [v1], { reveal: 0, commit: 1 }), "RoundUnitNeedsVerdict", [orderId, 0, 1, false]],
        [() => opStep(R, [v1, v2, ...extra], { reveal: 0, commit: 1 }), "RoundUnitNeedsVerdict", [orderId, 0, 1, false]],
        [() => opStep(R, [v1, a], { reveal: 0, commit: 1 }), "DuplicateParty", [a.address]],
        [() => opStep(R, [v1, v2, v1], { reveal: 0, commit: 1 }), "DuplicateParty", [v1.address]],
      ];
      expect(extra.length + 2).to.equal(6);
      for (const [call, error, args] of refusals) {
        await expect(call()).to.be.revertedWithCustomError(market, error).withArgs(...args);
        expect(await chainState(sys, orderId)).to.deep.equal(before);
      }
      // a verifier without free stake: the stake manager refuses its lock
      await expect(opStep(R, [v1, other], { reveal: 0, commit: 1 })).to.be.revertedWithCustomError(stakes,
        "InsufficientFreeStake").withArgs(other.address, 0n, PARAMS.verifierCollateral);
      await stakes.connect(v2).requestUnstake(200n * E18 - PARAMS.verifierCollateral + 1n);
      await expect(opStep(R, [v1, v2], { reveal: 0, commit: 1 })).to.be.revertedWithCustomError(stakes,
        "InsufficientFreeStake").withArgs(v2.address, PARAMS.verifierCollateral - 1n, PARAMS.verifierCollateral);
      expect(await chainState(sys, orderId)).to.deep.equal(before);
      expect(await market.unitCount()).to.equal(0n);
      for (const v of [v1, v2]) expect(await lockedOf(sys, v)).to.equal(0n);
      // five verifiers is the most; the step then goes through
      const five = [v1, ...extra];
      for (const x of extra) {
        await sys.token.mint(x.address, 100n * E18);
        await sys.token.connect(x).approve(await stakes.getAddress(), ethers.MaxUint256);
        await stakes.connect(x).stake(PARAMS.verifierCollateral);
      }
      const tx = await opStep(R, five, { reveal: 0, commit: 1 });
      await expectSetAside(R, tx, 0, 1, 1n, five);
      expect(await rosterState(sys, orderId)).to.include({ committed: 2n, setAsideUnits: 1n, openSetAside: 1n });
    });

    it("a provider whose streak drops (a fault elsewhere) has every later unit of its k=1 roster set aside",
      async function () {
      const STREAK = 2;
      const sys = await h.systemFixture();
      const { market } = sys;
      const [a, b, c] = sys.providers;
      const [v1, v2] = sys.verifiers;
      const deadline = BigInt(await time.latest()) + 30n * 24n * 3600n;
      const receipt = await (await market.connect(sys.buyer)
        .postAdaptiveOrder(ethers.id("spec"), 6, 1, 3, STREAK, PRICE, FEE, deadline)).wait();
      const orderId = receipt.logs.map((l) => market.interface.parseLog(l)).find((e) => e && e.name === "OrderPosted")
        .args.orderId;
      // a, b, c earn the trusted streak on two per-unit units
      for (let i = 0; i < STREAK; i++) {
        const { unitId, providers } = await h.assignUnit(sys, orderId);
        const same = providers.map(() => h.digestOf("same"));
        await h.commitAll(sys, unitId, providers, same);
        await h.revealAll(sys, unitId, providers, same);
        await market.connect(sys.operator).finalize(unitId);
      }
      const R = { ...rosterOf(sys, orderId, [a], { replicas: 1, unitsPerRound: 1, rounds: 3 }), digests: {} };
      await openRoster(R);
      expect(await rosterState(sys, orderId)).to.include({ requiredStreak: BigInt(STREAK) }); // k=1 < the order's 3
      await step(R, { commit: 0 });
      await expect(step(R, { reveal: 0, commit: 1 })).to.emit(market, "RoundRevealed").and.not.to.emit(market,
        "UnitSetAside");

      // a separate per-unit order: a never commits, the unit expires: one fault, streak 0
      const other = (await h.postOrder(sys, { units: 1 })).orderId;
      const fault = await h.assignUnit(sys, other, { providers: [a, b, c] });
      for (const [i, p] of [[1, b], [2, c]]) {
        await market.connect(p).commit(fault.unitId, h.commitmentOf(h.digestOf("x"), h.saltOf(`f${i}`), p.address,
          fault.unitId));
      }
      await time.increaseTo((await market.getUnit(fault.unitId)).verdictDeadline + 1n);
      await market.expireUnit(fault.unitId);
      expect(await market.reputationOf(a.address)).to.deep.equal([2n, 1n, 0n, 0n]);

      // round 1: a is below the roster's streak now, its unit needs a verdict
      await expect(step(R, { reveal: 1, commit: 2 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
        .withArgs(orderId, 1, 0, true);
      const tx1 = await opStep(R, [v1, v2], { reveal: 1, commit: 2 });
      const first = await market.unitCount();
      await expectSetAside(R, tx1, 1, 0, first, [v1, v2]);
      await verdict(sys, first, [0], [v1, v2]);
      expect(await market.reputationOf(a.address)).to.deep.equal([3n, 1n, 0n, 1n]);
      // round 2: one valid unit is not the streak of 2 yet: set aside again
      await expect(step(R, { reveal: 2 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
        .withArgs(orderId, 2, 0, true);
      const tx2 = await opStep(R, [v1, v2], { reveal: 2 });
      await expectSetAside(R, tx2, 2, 0, first + 1n, [v1, v2]);
      await verdict(sys, first + 1n, [0], [v1, v2]);
      expect(await rosterState(sys, orderId)).to.include({ committed: 3n, setAsideUnits: 2n, openSetAside: 0n });

      // close: round 0's unit by the roster, the other two by their verdicts
      await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 3, PRICE);
      expect(await earnedOf(market, a.address)).to.equal(2n * PRICE + 2n * PRICE + PRICE);
      // the roster's own unit counts valid but adds no streak: a's fault since the roster opened ended it
      expect(await market.reputationOf(a.address)).to.deep.equal([5n, 1n, 0n, 2n]);
      expect(await lockedOf(sys, a)).to.equal(0n);
      for (const v of [v1, v2]) expect(await earnedOf(market, v.address)).to.equal(FEE);
      // 2 per-unit units of 3 replicas, 3 round units of 1: the fees of the 2 finalized units and of the roster's
      // own unit come back, and the 3 round units' unused 2 replicas were never reserved
      const expected = 6n * (3n * PRICE + FEE) - 2n * 3n * PRICE - 3n * PRICE - 2n * FEE;
      expect(await orderFields(sys, orderId)).to.deep.equal(
        { balance: expected, delivered: 5n, openUnits: 0n, closed: false });
      await expect(market.connect(sys.buyer).closeOrder(orderId)).to.emit(market, "OrderClosed").withArgs(orderId, expected);
      await expectSolventLoose(sys);
    });

    it("a slash of a set-aside replica leaves the provider's other open unit's collateral locked", async function () {
      // c holds a roster (2 slots: 200 locked) and one open per-unit unit (100 locked) on 300 bonded
      const { sys, orderId, R } = await load(openedFixture);
      const { market, stakes } = sys;
      const appeals = await h.deployAppeals(sys);
      const [, , c] = R.signers;
      const [v1, v2] = sys.verifiers;
      await stakes.connect(c).stake(COLLATERAL);
      const solo = (await h.postOrder(sys, { units: 1, replicas: 1 })).orderId;
      const open = await h.assignUnit(sys, solo, { providers: [c] });
      expect(await stakes.stakeOf(c.address)).to.deep.equal([300n * E18, 300n * E18, 0n, 0n]);
      const digests = R.slots.map((_, i) => h.digestOf(`u${Math.floor(i / 3)}`));
      digests[2] = h.digestOf("cheat"); // unit 0, replica 2: c
      await step(R, { commit: 0, digests });
      const [{ unitId }] = await setAsideOf(R, await opStep(R, [v1, v2], { reveal: 0 }));
      await verdict(sys, unitId, [0, 0, 2], [v1, v2]);
      const [, since] = await market.heldOf(unitId);
      await time.increaseTo(since + h.APPEAL_PARAMS.appealWindow + 1n);
      await expect(appeals.settleVerdict(unitId, [0, 0, 2])).to.emit(market, "ReplicaSlashed")
        .withArgs(unitId, c.address, PARAMS.slashAmount);
      await time.increaseTo((await market.getOrder(orderId)).deadline + 1n);
      await closeTx(R);
      // the roster is settled: what stays locked is the open unit's collateral (as on the per-unit path, where a
      // fraud replica's collateral is released before the slash), not 100 - 60
      expect((await market.getUnit(open.unitId)).state).to.equal(h.UNIT_STATE.Committing);
      expect(await stakes.stakeOf(c.address)).to.deep.equal([240n * E18, COLLATERAL, 0n, 0n]);
    });

    /** c (2 roster slots: 200 locked) also works an open per-unit unit (100 locked) on 300 bonded; its replica
     * of the round's unit 0 is wrong, the unit is set aside and the verifiers accept it anyway (paid, nothing
     * held); p4 appeals and the panel decides accept/accept/fraud. */
    async function missedFraudFixture() {
      const f = await openedFixture();
      const { sys, R } = f;
      const appeals = await h.deployAppeals(sys);
      const referees = (await ethers.getSigners()).slice(11, 16);
      for (const r of referees) {
        await sys.token.mint(r.address, 1_000n * E18);
        await sys.token.connect(r).approve(await sys.stakes.getAddress(), ethers.MaxUint256);
        await sys.stakes.connect(r).stake(200n * E18);
        await appeals.connect(r).joinPool();
      }
      const [, , c] = R.signers;
      const [v1, v2] = sys.verifiers;
      await sys.stakes.connect(c).stake(COLLATERAL);
      const solo = (await h.postOrder(sys, { units: 1, replicas: 1 })).orderId;
      const open = await h.assignUnit(sys, solo, { providers: [c] });
      const digests = R.slots.map((_, i) => h.digestOf(`u${Math.floor(i / 3)}`));
      digests[2] = h.digestOf("cheat"); // unit 0, replica 2: c
      await step(R, { commit: 0, digests });
      const [{ unitId }] = await setAsideOf(R, await opStep(R, [v1, v2], { reveal: 0 }));
      await verdict(sys, unitId, [0, 0, 0], [v1, v2]);
      await appeals.connect(sys.providers[3]).appeal(unitId);
      await appeals.drawPanel(unitId);
      const panel = (await appeals.getAppeal(unitId)).panel.map((a) => referees.find((r) => r.address === a));
      const { chainId } = await ethers.provider.getNetwork();
      const domain = { name: "Veritrain VerdictAppeals", version: "1", chainId, verifyingContract: await appeals.getAddress() };
      const deadline = await h.farDeadline();
      for (const r of panel.slice(0, 2)) {
        const signature = await r.signTypedData(domain, { RefereeVote: h.TYPES.Verdict },
          { unitId, outcomesHash: h.outcomesHashOf([0, 0, 2]), deadline });
        await appeals.vote(unitId, [0, 0, 2], { referee: r.address, deadline, signature });
      }
      return { ...f, appeals, unitId, open, winners: panel.slice(0, 2) };
    }

    it("an appeal that finds fraud a set-aside unit's verdict missed: JobMarket slashes it after releasing one slot of the roster's lock, so the provider's other unit keeps its collateral",
      async function () {
      const { sys, orderId, R, appeals, unitId, open, winners } = await load(missedFraudFixture);
      const { market, stakes, token, buyer } = sys;
      const [a, , c] = R.signers;
      expect(await rosterState(sys, orderId)).to.include({ openSetAside: 0n, closed: false }); // nothing held
      expect(await market.reputationOf(c.address)).to.deep.equal([1n, 0n, 0n, 1n]); // paid by the verdict
      expect(await stakes.stakeOf(c.address)).to.deep.equal([300n * E18, 300n * E18, 0n, 0n]);
      const before = await Promise.all([buyer, ...winners].map((x) => token.balanceOf(x.address)));
      const tx = appeals.resolve(unitId, [0, 0, 0], [0, 0, 2]);
      await expect(tx).to.emit(market, "ReplicaSlashed").withArgs(unitId, c.address, PARAMS.slashAmount);
      await expect(tx).to.emit(appeals, "AppealResolved").withArgs(unitId, true, PARAMS.slashAmount);
      await expect(tx).to.not.emit(market, "HeldSettled");
      // the money as on the per-unit path: the bounty to the deciding referees, the rest to the buyer
      const bounty = (PARAMS.slashAmount * BigInt(h.APPEAL_PARAMS.bountyBps)) / 10_000n;
      expect(await token.balanceOf(buyer.address)).to.equal(before[0] + PARAMS.slashAmount - bounty);
      for (const [i, r] of winners.entries()) expect(await token.balanceOf(r.address)).to.equal(before[i + 1] + bounty / 2n);
      expect(await token.balanceOf(await appeals.getAddress())).to.equal(0n);
      // one slot of the roster's lock released before the slash: its other slot and the open unit stay locked
      expect(await stakes.stakeOf(c.address)).to.deep.equal([240n * E18, 200n * E18, 0n, 0n]);
      expect(await market.reputationOf(c.address)).to.deep.equal([1n, 0n, 1n, 0n]); // the fraud counted, streak ended
      await time.increaseTo((await market.getOrder(orderId)).deadline + 1n);
      await closeTx(R);
      expect((await market.getUnit(open.unitId)).state).to.equal(h.UNIT_STATE.Committing);
      expect(await stakes.stakeOf(c.address)).to.deep.equal([240n * E18, COLLATERAL, 0n, 0n]);
      // the close pays c's other slot of round 0 but adds no streak: its fraud count moved since the roster opened
      expect(await market.reputationOf(c.address)).to.deep.equal([2n, 0n, 1n, 0n]);
      expect(await market.reputationOf(a.address)).to.deep.equal([2n, 0n, 0n, 2n]);
      await expectSolventLoose(sys);
    });

    it("the same appeal resolved after the roster closed releases nothing more: the close released the roster's lock",
      async function () {
      const { sys, orderId, R, appeals, unitId, open } = await load(missedFraudFixture);
      const { market, stakes } = sys;
      const [, , c] = R.signers;
      await time.increaseTo((await market.getOrder(orderId)).deadline + 1n);
      await closeTx(R);
      expect(await stakes.stakeOf(c.address)).to.deep.equal([300n * E18, COLLATERAL, 0n, 0n]);
      await expect(appeals.resolve(unitId, [0, 0, 0], [0, 0, 2])).to.emit(market, "ReplicaSlashed")
        .withArgs(unitId, c.address, PARAMS.slashAmount);
      expect((await market.getUnit(open.unitId)).state).to.equal(h.UNIT_STATE.Committing);
      expect(await stakes.stakeOf(c.address)).to.deep.equal([240n * E18, COLLATERAL, 0n, 0n]);
      await expectSolventLoose(sys);
    });
  });

  describe("withheld slots and published openings", function () {
    const SLOT = 5; // unit 1, replica 2: c
    const WITHHELD = 1n << BigInt(SLOT);
    const PENALTY = PARAMS.withholdPenalty;
    const BOUNTY = PENALTY * BigInt(PARAMS.bountyBps) / 10_000n;

    /** Every slot's commitment of `round`, in slot order (the commit step's calldata). */
    const commitmentsOf = (R, round) => R.slots.map((_, i) => slotData(R, round, i).commitment);

    /** publishOpening of slot `slot` of `round` (its own opening unless `resultDigest` / `salt` are given). */
    function publishTx(R, slot, { round = 0, resultDigest, salt, commitments, caller, slotOf = slot } = {}) {
      const d = slotData(R, round, slotOf);
      return R.sys.market.connect(caller ?? R.sys.other).publishOpening(R.orderId, R.addrs, R.layout, slot,
        resultDigest ?? d.resultDigest, salt ?? d.salt, commitments ?? commitmentsOf(R, round),
        auditChainsOf(R.records ?? []).pending);
    }

    /** The end of the pending round's reveal window (pendingSince + revealWindow). */
    const windowEndOf = async (sys, orderId) => (await rosterState(sys, orderId)).pendingSince + PARAMS.revealWindow;

    /** Moves time to one second past the pending round's reveal window. */
    async function pastRevealWindow(sys, orderId) {
      await time.increaseTo((await windowEndOf(sys, orderId)) + 1n);
    }

    /** Checks set-aside unit `unitId` (unit `unit` of `round`): every replica committed, those in `unrevealed`
     * (replica indices) not revealed and holding their commitment, the others revealed with their digest. */
    async function expectUnrevealed(R, unitId, round, unit, unrevealed, verifiers) {
      const { market } = R.sys;
      const k = R.replicas;
      const u = await market.getUnit(unitId);
      const revealedMask = BigInt((1 << k) - 1) & ~BigInt(unrevealed.reduce((m, r) => m | (1 << r), 0));
      expect([u.orderId, u.state, u.replicas, u.verifierCount, u.committedMask, u.revealedMask, u.drawn])
        .to.deep.equal([R.orderId, h.UNIT_STATE.Revealing, BigInt(k), BigInt(verifiers.length), BigInt((1 << k) - 1),
          revealedMask, true]);
      for (let r = 0; r < k; r++) {
        const d = slotData(R, round, unit * k + r);
        const withheld = unrevealed.includes(r);
        expect(await market.replicaOf(unitId, r)).to.deep.equal(
          [d.provider.address, withheld ? d.commitment : d.resultDigest, true, !withheld]);
      }
      expect(await market.verifiersOf(unitId)).to.deep.equal(addrsOf(verifiers));
    }

    it("refuses a withheld slot until the pending round's reveal window has passed (RoundRevealWindowOpen), strictly after",
      async function () {
      const { sys, orderId, R } = await load(committedFixture);
      const { market } = sys;
      const [v1, v2] = sys.verifiers;
      const until = await windowEndOf(sys, orderId);
      expect(until).to.equal((await rosterState(sys, orderId)).pendingSince + 600n);
      const before = await chainState(sys, orderId);
      await expect(opStep(R, [v1, v2], { reveal: 0, withheld: WITHHELD })).to.be.revertedWithCustomError(market,
        "RoundRevealWindowOpen").withArgs(orderId, until);
      await expect(step(R, { reveal: 0, commit: 1, withheld: WITHHELD })).to.be.revertedWithCustomError(market,
        "RoundRevealWindowOpen").withArgs(orderId, until);
      // an opening published for the slot does not lift the window either
      await publishTx(R, SLOT);
      await expect(step(R, { reveal: 0, withheld: WITHHELD })).to.be.revertedWithCustomError(market,
        "RoundRevealWindowOpen").withArgs(orderId, until);
      // a step with every opening needs no window
      await market.stepRound.staticCall(orderId, R.addrs, R.layout, openingsFor(R, 0), 0, [], 0, NO_WORK, NO_AUDIT);
      // the window's last second is still inside it (sent with a gas limit: mined at exactly `until`)
      await time.setNextBlockTimestamp(until);
      await expect(opStep(R, [v1, v2], { reveal: 0, withheld: WITHHELD, overrides: { gasLimit: 3_000_000 } }))
        .to.be.revertedWithCustomError(market, "RoundRevealWindowOpen").withArgs(orderId, until);
      expect(await chainState(sys, orderId)).to.deep.equal(before);
      // one second later it goes through (the published opening counts: nothing to set aside)
      await time.setNextBlockTimestamp(until + 1n);
      const tx = await step(R, { reveal: 0, withheld: WITHHELD });
      await expect(tx).to.emit(market, "RoundRevealed").withArgs(orderId, 0, unitDigests(R, 0), 0n);
      await expect(tx).to.not.emit(market, "UnitSetAside");
      expect(await timestampOf(tx)).to.equal(until + 1n);
    });

    it("a withheld slot is set aside unrevealed; accept/accept/fault slashes the withhold penalty after releasing one slot's collateral; the close pays the rest",
      async function () {
      const { sys, orderId, R } = await load(committedFixture);
      const { market, stakes, buyer } = sys;
      const [a, b, c] = R.signers;
      const [v1, v2] = sys.verifiers;
      await pastRevealWindow(sys, orderId);
      const tx = await opStep(R, [v1, v2], { reveal: 0, commit: 1, withheld: WITHHELD });
      await expect(tx).to.emit(market, "RoundRevealed").withArgs(orderId, 0, unitDigests(R, 0), 0n);
      await expect(tx).to.emit(market, "RoundCommitted").withArgs(orderId, 1);
      expect(await setAsideOf(R, tx)).to.deep.equal([{ round: 0n, unit: 1n, unitId: 1n }]);
      const at = (await timestampOf(tx)) - 1n;
      await expect(tx).to.emit(market, "UnitAssigned").withArgs(1n, orderId, word(roundUnitIdOf(orderId, 0, 1)),
        [a.address, b.address, c.address], [v1.address, v2.address], at);
      await expect(tx).to.emit(market, "VerificationRequested").withArgs(1n);
      await expectUnrevealed(R, 1n, 0, 1, [2], [v1, v2]);
      expect((await market.getUnit(1n)).verdictDeadline).to.equal(at + PARAMS.verdictWindow);
      expect(await rosterState(sys, orderId)).to.include({ committed: 2n, setAsideUnits: 1n, openSetAside: 1n });
      for (const p of [a, b, c]) expect(await lockedOf(sys, p)).to.equal(2n * COLLATERAL);
      for (const v of [v1, v2]) expect(await lockedOf(sys, v)).to.equal(PARAMS.verifierCollateral);
      await expectSolventLoose(sys);

      // an unrevealed replica can only be a fault
      await expect(verdict(sys, 1n, [0, 0, 0], [v1, v2])).to.be.revertedWithCustomError(market, "InvalidOutcome")
        .withArgs(2, 0);
      await expect(verdict(sys, 1n, [0, 0, 2], [v1, v2])).to.be.revertedWithCustomError(market, "InvalidOutcome")
        .withArgs(2, 2);
      const vtx = await verdict(sys, 1n, [0, 0, 1], [v1, v2]);
      await expect(vtx).to.emit(market, "RevealWithheld").withArgs(1n, c.address, PENALTY);
      await expect(vtx).to.emit(market, "VerdictRecorded").withArgs(1n, [0, 0, 1], h.outcomesHashOf([0, 0, 1]),
        [v1.address, v2.address]);
      await expect(vtx).to.not.emit(market, "FraudHeld");
      await expect(vtx).to.not.emit(market, "ReplicaSlashed");
      expect((await market.getUnit(1n)).state).to.equal(h.UNIT_STATE.Verdicted);
      // c: one slot's collateral of the roster's lock released, then the penalty slashed; a, b keep the roster's lock
      expect(await stakes.stakeOf(c.address)).to.deep.equal([200n * E18 - PENALTY, COLLATERAL, 0n, 0n]);
      for (const p of [a, b]) expect(await stakes.stakeOf(p.address)).to.deep.equal([200n * E18, 2n * COLLATERAL, 0n, 0n]);
      for (const p of [a, b]) {
        expect(await earnedOf(market, p.address)).to.equal(PRICE);
        expect(await market.reputationOf(p.address)).to.deep.equal([1n, 0n, 0n, 1n]);
      }
      expect(await earnedOf(market, c.address)).to.equal(0n);
      expect(await market.reputationOf(c.address)).to.deep.equal([0n, 1n, 0n, 0n]);
      for (const v of [v1, v2]) {
        expect(await earnedOf(market, v.address)).to.equal((FEE + BOUNTY) / 2n);
        expect(await lockedOf(sys, v)).to.equal(0n);
      }
      expect(await earnedOf(market, buyer.address)).to.equal(PENALTY - BOUNTY);
      expect(await rosterState(sys, orderId)).to.include({ setAsideUnits: 1n, openSetAside: 0n });
      // c's unpaid price is the order's again
      expect(await orderFields(sys, orderId)).to.deep.equal({ balance: PRICE, delivered: 1n, openUnits: 5n, closed: false });
      expect(await market.totalCredits()).to.equal(2n * PRICE + FEE + PENALTY);
      await expectSolventLoose(sys);

      // rounds 1 and 2 as usual; the close pays every slot but the set-aside unit's and releases the rest of the lock
      await step(R, { reveal: 1, commit: 2 });
      await step(R, { reveal: 2 });
      await expectWithheldOrderClosed(R, { honestSlots: 6n, refund: PRICE + 5n * FEE, delivered: 6n,
        buyerBefore: PENALTY - BOUNTY, creditsLeft: FEE + BOUNTY });
    });

    it("a withheld set-aside unit nobody settles expires: the withhold penalty is slashed to the buyer, the close pays the rest",
      async function () {
      const { sys, orderId, R } = await load(committedFixture);
      const { market, stakes, buyer } = sys;
      const [a, b, c] = R.signers;
      const [v1, v2] = sys.verifiers;
      await pastRevealWindow(sys, orderId);
      const tx = await opStep(R, [v1, v2], { reveal: 0, withheld: WITHHELD });
      expect(await setAsideOf(R, tx)).to.deep.equal([{ round: 0n, unit: 1n, unitId: 1n }]);
      await expectUnrevealed(R, 1n, 0, 1, [2], [v1, v2]);
      const { verdictDeadline } = await market.getUnit(1n);
      await expect(market.expireUnit(1n)).to.be.revertedWithCustomError(market, "UnitNotExpired")
        .withArgs(1n, verdictDeadline);
      await time.increaseTo(verdictDeadline + 1n);
      const etx = market.connect(sys.other).expireUnit(1n);
      await expect(etx).to.emit(market, "UnitExpired").withArgs(1n);
      await expect(etx).to.emit(market, "RevealWithheld").withArgs(1n, c.address, PENALTY);
      expect((await market.getUnit(1n)).state).to.equal(h.UNIT_STATE.Expired);
      expect(await stakes.stakeOf(c.address)).to.deep.equal([200n * E18 - PENALTY, COLLATERAL, 0n, 0n]);
      expect(await market.reputationOf(c.address)).to.deep.equal([0n, 1n, 0n, 0n]);
      for (const p of [a, b]) {
        expect(await stakes.stakeOf(p.address)).to.deep.equal([200n * E18, 2n * COLLATERAL, 0n, 0n]);
        expect(await market.reputationOf(p.address)).to.deep.equal([0n, 0n, 0n, 0n]); // revealed: no fault
      }
      for (const v of [v1, v2]) {
        expect(await lockedOf(sys, v)).to.equal(0n);
        expect(await earnedOf(market, v.address)).to.equal(0n);
      }
      expect(await earnedOf(market, buyer.address)).to.equal(PENALTY);
      expect(await rosterState(sys, orderId)).to.include({ setAsideUnits: 1n, openSetAside: 0n });
      expect(await orderFields(sys, orderId)).to.deep.equal(
        { balance: 3n * PRICE + FEE, delivered: 0n, openUnits: 5n, closed: false });
      await expectSolventLoose(sys);

      await step(R, { commit: 1 });
      await step(R, { reveal: 1, commit: 2 });
      await step(R, { reveal: 2 });
      await expectWithheldOrderClosed(R, { honestSlots: 5n, refund: 3n * PRICE + 6n * FEE, delivered: 5n,
        buyerBefore: PENALTY, creditsLeft: 0n });
    });

    it("an opening published on chain makes the withheld bit harmless: revealed with the published digest, nothing set aside",
      async function () {
      const { sys, orderId, R } = await load(committedFixture);
      const { market } = sys;
      const [a, b, c] = R.signers;
      // slot 3 (unit 1, replica 0: a): RoundRevealed reports replica 0's digest, so it shows which value was used
      const d3 = slotData(R, 0, 3);
      await expect(publishTx(R, 3, { caller: sys.other })).to.emit(market, "OpeningPublished")
        .withArgs(orderId, 0, 3, d3.resultDigest);
      await pastRevealWindow(sys, orderId);
      // an unpublished withheld slot needs a verdict (not the operator's step here) ...
      await expect(step(R, { reveal: 0, withheld: WITHHELD })).to.be.revertedWithCustomError(market,
        "RoundUnitNeedsVerdict").withArgs(orderId, 0, 1, false);
      // ... the published one does not: anyone steps, without verifiers
      const tx = await step(R, { reveal: 0, commit: 1, withheld: 1n << 3n });
      await expect(tx).to.emit(market, "RoundRevealed").withArgs(orderId, 0, [slotData(R, 0, 0).resultDigest, d3.resultDigest], 0n);
      expect(d3.resultDigest).to.not.equal(d3.commitment);
      await expect(tx).to.not.emit(market, "UnitSetAside");
      expect(await market.unitCount()).to.equal(0n);
      expect(await rosterState(sys, orderId)).to.include({ committed: 2n, setAsideUnits: 0n, openSetAside: 0n });

      // the publication is the round's: round 1's slot 3 withheld (nothing published for it) needs a verdict
      await pastRevealWindow(sys, orderId);
      await expect(step(R, { reveal: 1, withheld: 1n << 3n })).to.be.revertedWithCustomError(market,
        "RoundUnitNeedsVerdict").withArgs(orderId, 1, 1, false);
      await step(R, { reveal: 1, commit: 2 });
      await step(R, { reveal: 2 });
      // every slot paid by the roster, nobody penalized
      await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 3, 18n * PRICE);
      for (const p of [a, b, c]) {
        expect(await earnedOf(market, p.address)).to.equal(6n * PRICE);
        expect(await market.reputationOf(p.address)).to.deep.equal([6n, 0n, 0n, 6n]);
        expect(await sys.stakes.stakeOf(p.address)).to.deep.equal([200n * E18, 0n, 0n, 0n]);
      }
      await expectSolventLoose(sys);
    });

    it("a published opening that disagrees counts as revealed: its unit is set aside revealed and may be judged fraud",
      async function () {
      const { sys, orderId, R } = await load(openedFixture);
      const { market } = sys;
      const [v1, v2] = sys.verifiers;
      const digests = R.slots.map((_, i) => h.digestOf(`u${Math.floor(i / 3)}`));
      digests[SLOT] = h.digestOf("cheat");
      await step(R, { commit: 0, digests });
      await publishTx(R, SLOT);
      await pastRevealWindow(sys, orderId);
      await expect(step(R, { reveal: 0, withheld: WITHHELD, verifiers: [v1, v2] })).to.be.revertedWithCustomError(market,
        "RoundUnitNeedsVerdict").withArgs(orderId, 0, 1, false);
      const tx = await opStep(R, [v1, v2], { reveal: 0, withheld: WITHHELD });
      await expectSetAside(R, tx, 0, 1, 1n, [v1, v2]); // every replica revealed, slot 5 with the published digest
      expect((await market.replicaOf(1n, 2))[1]).to.equal(h.digestOf("cheat"));
      const vtx = await verdict(sys, 1n, [0, 0, 2], [v1, v2]);
      await expect(vtx).to.emit(market, "FraudHeld").withArgs(1n, 4);
      await expect(vtx).to.not.emit(market, "RevealWithheld");
    });

    it("publishOpening refusals: no round pending, slot out of range, wrong commitments, a mismatched opening", async function () {
      const { sys, orderId, deadline, R } = await load(openedFixture);
      const { market } = sys;
      const [, b, c] = R.signers;
      await expect(publishTx(R, SLOT)).to.be.revertedWithCustomError(market, "NoRoundToStep").withArgs(orderId, 0);
      await step(R, { commit: 0 });
      const commitments = commitmentsOf(R, 0);
      const unitId = roundUnitIdOf(orderId, 0, 1);
      await expect(publishTx(R, 6, { slotOf: SLOT })).to.be.revertedWithCustomError(market, "InvalidLayout").withArgs(6);
      await expect(publishTx(R, 2n ** 255n, { slotOf: SLOT })).to.be.revertedWithCustomError(market, "InvalidLayout")
        .withArgs(2n ** 255n);
      await expect(publishTx(R, SLOT, { commitments: commitments.slice(0, 5) })).to.be.revertedWithCustomError(market,
        "EntryCountMismatch").withArgs(6, 5);
      await expect(publishTx(R, SLOT, { commitments: [...commitments].reverse() })).to.be.revertedWithCustomError(market,
        "RoundHashMismatch").withArgs(orderId, 0);
      await expect(publishTx(R, SLOT, { commitments: commitmentsOf({ ...R, digests: {} }, 1) }))
        .to.be.revertedWithCustomError(market, "RoundHashMismatch").withArgs(orderId, 0);
      await expect(publishTx(R, SLOT, { salt: h.saltOf("other") })).to.be.revertedWithCustomError(market, "RevealMismatch")
        .withArgs(unitId, c.address);
      await expect(publishTx(R, SLOT, { resultDigest: h.digestOf("other") })).to.be.revertedWithCustomError(market,
        "RevealMismatch").withArgs(unitId, c.address);
      // another slot's opening: b's of the same unit, c's own of unit 0
      await expect(publishTx(R, SLOT, { slotOf: 4 })).to.be.revertedWithCustomError(market, "RevealMismatch")
        .withArgs(unitId, c.address);
      await expect(publishTx(R, SLOT, { slotOf: 2 })).to.be.revertedWithCustomError(market, "RevealMismatch")
        .withArgs(unitId, c.address);
      // the right opening in another slot is refused in that slot's name
      await expect(publishTx(R, 4, { slotOf: SLOT })).to.be.revertedWithCustomError(market, "RevealMismatch")
        .withArgs(unitId, b.address);
      await expect(market.publishOpening(orderId, R.addrs, layoutOf([1, 2, 0, 1, 2, 0]), SLOT, slotData(R, 0, SLOT).resultDigest,
        slotData(R, 0, SLOT).salt, commitments, ethers.ZeroHash)).to.be.revertedWithCustomError(market, "RosterMismatch")
        .withArgs(orderId);
      // none of them recorded anything: the slot withheld still needs a verdict
      await pastRevealWindow(sys, orderId);
      await expect(step(R, { reveal: 0, withheld: WITHHELD })).to.be.revertedWithCustomError(market,
        "RoundUnitNeedsVerdict").withArgs(orderId, 0, 1, false);
      // the right one, by anyone (after the window too); then the same step goes through
      await expect(publishTx(R, SLOT, { caller: sys.buyer })).to.emit(market, "OpeningPublished")
        .withArgs(orderId, 0, SLOT, slotData(R, 0, SLOT).resultDigest);
      await expect(step(R, { reveal: 0, withheld: WITHHELD })).to.emit(market, "RoundRevealed").and.not.to.emit(market,
        "UnitSetAside");
      // revealed: nothing pending
      await expect(publishTx(R, SLOT)).to.be.revertedWithCustomError(market, "NoRoundToStep").withArgs(orderId, 1);
      await time.increaseTo(deadline + 1n);
      await closeTx(R);
      await expect(publishTx(R, SLOT)).to.be.revertedWithCustomError(market, "RosterNotOpen").withArgs(orderId);
    });

    it("a withheld slot from anyone but the operator with verifiers is refused (RoundUnitNeedsVerdict); its entry must be its commitment",
      async function () {
      const { sys, orderId, R } = await load(committedFixture);
      const { market } = sys;
      const [v1, v2] = sys.verifiers;
      await pastRevealWindow(sys, orderId);
      const before = await chainState(sys, orderId);
      await expect(step(R, { reveal: 0, commit: 1, withheld: WITHHELD, verifiers: [v1, v2] }))
        .to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict").withArgs(orderId, 0, 1, false);
      await expect(opStep(R, [], { reveal: 0, withheld: WITHHELD })).to.be.revertedWithCustomError(market,
        "RoundUnitNeedsVerdict").withArgs(orderId, 0, 1, false);
      await expect(opStep(R, [v1], { reveal: 0, withheld: WITHHELD })).to.be.revertedWithCustomError(market,
        "RoundUnitNeedsVerdict").withArgs(orderId, 0, 1, false);
      // slots withheld in both units: the first unit that needs a verdict is named
      await expect(step(R, { reveal: 0, withheld: (1n << 1n) | WITHHELD })).to.be.revertedWithCustomError(market,
        "RoundUnitNeedsVerdict").withArgs(orderId, 0, 0, false);
      // a withheld entry carrying anything but the slot's commitment (its digest, its opening) fails the round's hash
      const wrong = givenOpenings(R, 0, WITHHELD).map((o, i) => (i === SLOT ? openingsFor(R, 0)[SLOT] : o));
      await expect(market.connect(sys.operator).stepRound(orderId, R.addrs, R.layout, wrong, WITHHELD, [v1.address, v2.address],
        0, NO_WORK, NO_AUDIT)).to.be.revertedWithCustomError(market, "RoundHashMismatch").withArgs(orderId, 0);
      expect(await chainState(sys, orderId)).to.deep.equal(before);
      // the operator with verifiers sets both units aside, b's and c's replicas unrevealed
      const tx = await opStep(R, [v1, v2], { reveal: 0, withheld: (1n << 1n) | WITHHELD });
      expect(await setAsideOf(R, tx)).to.deep.equal([{ round: 0n, unit: 0n, unitId: 1n }, { round: 0n, unit: 1n, unitId: 2n }]);
      await expectUnrevealed(R, 1n, 0, 0, [1], [v1, v2]);
      await expectUnrevealed(R, 2n, 0, 1, [2], [v1, v2]);
      expect(await rosterState(sys, orderId)).to.include({ setAsideUnits: 2n, openSetAside: 2n, pendingBlock: 0n });
      await expectSolventLoose(sys);
    });
  });

  describe("the round path's own contract", function () {
    it("called on its own address, each action reverts NotDelegated; a non-operator openRoster is refused", async function () {
      const { sys, orderId, R } = await load(orderFixture);
      // the round path lives in JobMarket's delegate (JobMarketRoundsExtension at `roundsExtension()`)
      const [getter, artifact] = ["roundsExtension", "JobMarketRoundsExtension"];
      const rounds = await ethers.getContractAt(artifact, await sys.market[getter]());
      expect(await ethers.provider.getCode(await rounds.getAddress())).to.not.equal("0x");
      const accepts = await acceptsFor(R);
      for (const call of [
        () => rounds.connect(sys.operator).openRoster(orderId, R.addrs, R.layout, 3, 2, 3, [], accepts),
        () => rounds.stepRound(orderId, R.addrs, R.layout, [], 0, [], 0, NO_WORK, NO_AUDIT),
        () => rounds.closeRoster(orderId, R.addrs, R.layout, [], []),
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
      // the closes paid every party: nothing is left to withdraw
      for (const p of [sys.buyer, ...R.signers]) expect(await market.credits(p.address)).to.equal(0n);
      const stepsTotal = steps.reduce((x, y) => x + y, 0n);
      const total = Object.values(g).reduce((x, y) => x + y, 0n) + stepsTotal;
      const perShard = total / BigInt(SHARDS * rounds);
      console.log(`    k=${k} providers=${k} unitsPerRound=${UNITS_PER_ROUND} rounds=${rounds}: ` +
        `openRoster ${g.openRoster}, steps [${steps.join(", ")}], closeRoster ${g.closeRoster}, ` +
        `postOrder ${g.postOrder}, closeOrder ${g.closeOrder}; ` +
        `TOTAL ${total}, per shard unit ${perShard}`);
      for (const s of steps) expect(s).to.be.lt(600_000n);
      expect(g.openRoster).to.be.lt(600_000n);
      expect(g.closeRoster).to.be.lt(300_000n);
      expect(perShard).to.be.lt(k === 1 ? 100_000n : 200_000n);
      const order = await market.getOrder(orderId);
      expect([order.delivered, order.closed]).to.deep.equal([BigInt(UNITS_PER_ROUND * rounds), true]);
      await expectSolventLoose(sys);
    }

    it("prints the gas of a step that sets one unit aside (k=3, 9 units a round) against a normal step", async function () {
      const sys = await loadFixture(gasFixture);
      const { market } = sys;
      const [v1, v2] = sys.verifiers;
      const rounds = 4;
      const { orderId } = await h.postOrder(sys, { units: UNITS_PER_ROUND * rounds });
      const R = rosterOf(sys, orderId, sys.providers.slice(0, 3), { unitsPerRound: UNITS_PER_ROUND, rounds });
      await openRoster(R);
      // rounds 1 and 2: the aggregate unit (8) split, so their reveals each set it aside
      const split = (round) => R.slots.map((_, i) => (i === 3 * SHARDS + 2 ? h.digestOf(`odd${round}`)
        : h.digestOf(`${orderId}:${round}:${Math.floor(i / 3)}`)));
      await step(R, { commit: 0 });
      const normal = await gasOf(step(R, { reveal: 0, commit: 1, digests: split(1) }));
      const first = await gasOf(opStep(R, [v1, v2], { reveal: 1, commit: 2, digests: split(2) }));
      const second = await gasOf(opStep(R, [v1, v2], { reveal: 2, commit: 3 }));
      const revealOnly = await gasOf(step(R, { reveal: 3 }));
      console.log(`    k=3 unitsPerRound=${UNITS_PER_ROUND}: reveal+commit step ${normal}; the same setting 1 unit aside ` +
        `(2 verifiers) ${first} (first: registers 5 party ids), ${second} (parties known), +${second - normal}; ` +
        `reveal-only step ${revealOnly}`);
      expect(await rosterState(sys, orderId)).to.include({ setAsideUnits: 2n, openSetAside: 2n });
      expect(second - normal).to.be.lt(250_000n);
      expect(first).to.be.gt(second);
    });

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

/** The close of a 3-round roster on a, b, c whose slot 5 (c) was withheld in round 0 and settled alone: a
 * and b paid `honestSlots` each with their streak, c its 5 roster slots but no streak (its fault) and the
 * penalty gone from its stake, every lock released; the order closes with `refund` to a buyer credited
 * `buyerBefore` already; escrow empty, `creditsLeft` (the set-aside unit's verifiers') the only credits left, and
 * exact solvency. */
async function expectWithheldOrderClosed(R, { honestSlots, refund, delivered, buyerBefore, creditsLeft }) {
  const { sys, orderId } = R;
  const { market, stakes, buyer } = sys;
  const [a, b, c] = R.signers;
  const PENALTY = PARAMS.withholdPenalty;
  await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 3, 15n * PRICE);
  for (const p of [a, b]) {
    expect(await earnedOf(market, p.address)).to.equal(honestSlots * PRICE);
    expect(await market.reputationOf(p.address)).to.deep.equal([honestSlots, 0n, 0n, honestSlots]);
    expect(await stakes.stakeOf(p.address)).to.deep.equal([200n * E18, 0n, 0n, 0n]);
  }
  expect(await earnedOf(market, c.address)).to.equal(5n * PRICE);
  expect(await market.reputationOf(c.address)).to.deep.equal([5n, 1n, 0n, 0n]); // its fault ended the streak
  expect(await stakes.stakeOf(c.address)).to.deep.equal([200n * E18 - PENALTY, 0n, 0n, 0n]);
  expect(await orderFields(sys, orderId)).to.deep.equal({ balance: refund, delivered, openUnits: 0n, closed: false });
  await expect(market.connect(buyer).closeOrder(orderId)).to.emit(market, "OrderClosed").withArgs(orderId, refund);
  expect(await earnedOf(market, buyer.address)).to.equal(buyerBefore + refund);
  expect(await market.totalEscrow()).to.equal(0n);
  expect(await market.totalCredits()).to.equal(creditsLeft); // the closes paid the roster's parties and the buyer
  await expectSolventLoose(sys);
}

// ------------------------------------------------------------------------------------------------
// Round audits: roster verifiers sign RoundAudit for the units the chain draws; a challenge holds them to it
// ------------------------------------------------------------------------------------------------

const MASK64 = (1n << 64n) - 1n;
/** A 4-unit order's escrow (k = 3). */
const ESCROW_4 = 4n * (3n * PRICE + FEE);
const digestsHashOf = (digests) => ethers.keccak256(digests.length ? ethers.concat(digests) : "0x");

/** The record a step that reveals `round` leaves pending for its drawn unanimous units `mask` (its digests hash:
 * every unit's digest of the round, as RoundRevealed gives them). */
const roundRecordOf = (R, round, mask) =>
  ({ info: BigInt(mask) | (BigInt(round) << 176n), digestsHash: digestsHashOf(unitDigests(R, round)) });

/** A step's posting, signed by `signers` (roster verifiers) over the pending chain once the step adds `added` (round
 * records, e.g. [roundRecordOf(R, round, mask)]). opts: records (the records signed, instead of R.records + added),
 * orderId (the order signed), signerOf(s) (who really signs), indexOf(s), verifiers (the list given). */
async function postingOf(R, added, signers, opts = {}) {
  const { pending } = auditChainsOf(opts.records ?? [...(R.records ?? []), ...added]);
  const signatures = [];
  for (const s of signers) {
    const sig = ethers.Signature.from(await h.signMarket(opts.signerOf?.(s) ?? s, R.sys.market, "RoundAudit",
      { orderId: opts.orderId ?? R.orderId, records: pending }));
    signatures.push({ verifier: opts.indexOf?.(s) ?? R.auditors.indexOf(s.address), r: sig.r, vs: sig.yParityAndS });
  }
  return { verifiers: opts.verifiers ?? R.auditors, signatures };
}

/** The operator's challenge of unit `unit` of `round`, giving `info` as that round's record (the roster's records
 * from its posting's first round record to the last posting, the posted chain before them as `prefix`);
 * opts.records replaces the records sent, opts.prefix the prefix, opts.at the record index and unit. */
async function challengeTx(R, round, unit, info, verifiers, caller, opts = {}) {
  const index = R.records.findIndex((r) => !(r.info & POSTING) && (r.info >> 176n) === BigInt(round));
  let start = index;
  while (start > 0 && !(R.records[start - 1].info & POSTING)) start -= 1;
  let end = R.records.length;
  while (end > 0 && !(R.records[end - 1].info & POSTING)) end -= 1;
  const sent = R.records.slice(start, end).map((r, i) => (i === index - start ? { ...r, info } : r));
  const tx = await R.sys.market.connect(caller ?? R.sys.operator).challengeAudit(R.orderId, R.addrs, R.layout,
    opts.at ?? ((BigInt(index - start) << 8n) | BigInt(unit)), opts.prefix ?? auditChainsOf(R.records.slice(0, start)).chain,
    opts.records ?? sent, unitDigests(R, round), R.auditors, addrsOf(verifiers));
  await trackAudits(R, tx);
  return tx;
}

/** setAsidePending taking the last `count` of the roster's pending records (`R.records`) off its pending chain, with
 * `verifiers` (set aside) or none (dropped); the chained commitments of the round committed and not revealed, if
 * any, read from the chain. opts: kept, records, digests, committed replace what is sent. */
async function setAsidePendingTx(R, count, verifiers, caller, opts = {}) {
  const records = R.records.slice(R.records.length - count);
  const roster = await rosterState(R.sys, R.orderId);
  const committed = roster.pendingBlock !== 0n ? roundHashOf(R, Number(roster.committed) - 1) : ethers.ZeroHash;
  const tx = await R.sys.market.connect(caller ?? R.sys.operator).setAsidePending(R.orderId, R.addrs, R.layout,
    opts.kept ?? auditChainsOf(R.records.slice(0, R.records.length - count)).pending, opts.records ?? records,
    opts.digests ?? records.flatMap((r) => unitDigests(R, Number(r.info >> 176n))), opts.committed ?? committed,
    addrsOf(verifiers));
  await trackAudits(R, tx);
  return tx;
}

// Closes the roster; returns what the close credited each of `verifiers` (their audit fees).
async function closeCrediting(R, verifiers) {
  const before = [];
  for (const v of verifiers) before.push(await earnedOf(R.sys.market, v.address));
  await closeTx(R);
  const credited = [];
  for (const [i, v] of verifiers.entries()) credited.push((await earnedOf(R.sys.market, v.address)) - before[i]);
  return credited;
}

/** The audit key the contract must hold for `R.records`: the verifiers' hash and the posted chain. */
const auditKeyOf = (R) =>
  chain(ethers.keccak256(coder.encode(["address[]"], [R.auditors])), auditChainsOf(R.records ?? []).chain);

/** Each roster verifier's count of posted audited units not challenged, from the roster's records (what the close
 * pays), after checking the records are the roster's (its audit key). */
async function auditCounts(R) {
  expect((await R.sys.market.rosterAuditsOf(R.orderId)).key).to.equal(auditKeyOf(R));
  const bits = (x) => x.toString(2).split("").filter((b) => b === "1").length;
  const counts = R.auditors.map(() => 0n);
  let units = 0n;
  for (const r of R.records ?? []) {
    if (!(r.info & POSTING)) {
      units += BigInt(bits(r.info & MASK64 & ~(r.info >> 112n)));
      continue;
    }
    for (let i = 0; i < counts.length; i++) if ((r.info >> (64n + BigInt(i))) & 1n) counts[i] += units;
    units = 0n;
  }
  return counts;
}

/** An order of 4 units (k = 3) with every unit drawn (spotCheckPpm 1e6), its roster of 2 rounds of 2 units on
 * p1..p3 audited by v1..v3, opened. */
async function auditedFixture() {
  const sys = await h.fundedSystem({ ...PARAMS, spotCheckPpm: 1_000_000 });
  const appeals = await h.deployAppeals(sys);
  const { orderId } = await h.postOrder(sys, { units: 4 });
  const R = rosterOf(sys, orderId, sys.providers.slice(0, 3), { rounds: 2 });
  R.auditors = addrsOf(sys.verifiers);
  await openRoster(R);
  return { sys, appeals, orderId, R };
}

describe("JobMarket: round audits (roster verifiers, RoundAudit, challenges)", function () {
  it("openRoster: the providers' Accept covers the verifiers; verifiers are 2..5 distinct non-providers, each locking verifierCollateral",
    async function () {
    const { sys, orderId, R } = await load(orderFixture);
    const { market } = sys;
    const [v1, v2, v3] = sys.verifiers;
    const [a] = R.signers;
    R.auditors = [v1.address, v2.address];
    const partiesKey = rosterKeyOf(R.addrs, R.layout, 3, 2, 3);
    expect(await market.rosterKey(R.addrs, R.layout, 3, 2, 3, R.auditors))
      .to.equal(ethers.keccak256(coder.encode(["bytes32", "address[]"], [partiesKey, R.auditors])));
    expect(await market.rosterKey(R.addrs, R.layout, 3, 2, 3, [])).to.equal(partiesKey);
    const accepts = await acceptsFor(R);
    // the operator cannot swap a verifier the providers accepted
    R.auditors = [v1.address, v3.address];
    await expect(openTx(R, accepts)).to.be.revertedWithCustomError(market, "InvalidSigner");
    R.auditors = [v1.address, a.address];
    await expect(openTx(R, await acceptsFor(R))).to.be.revertedWithCustomError(market, "DuplicateParty").withArgs(a.address);
    R.auditors = [v1.address, v1.address];
    await expect(openTx(R, await acceptsFor(R))).to.be.revertedWithCustomError(market, "DuplicateParty").withArgs(v1.address);
    R.auditors = [v1.address];
    await expect(openTx(R, await acceptsFor(R))).to.be.revertedWithCustomError(market, "InvalidVerifierCount")
      .withArgs(1, 2, 5);
    R.auditors = [v1.address, v2.address];
    const tx = await openTx(R, accepts);
    await expect(tx).to.emit(market, "RosterVerifiers").withArgs(orderId, R.auditors);
    for (const v of [v1, v2]) expect(await lockedOf(sys, v)).to.equal(PARAMS.verifierCollateral);
    expect(await lockedOf(sys, v3)).to.equal(0n);
    const audits = await market.rosterAuditsOf(orderId);
    expect([audits.key, audits.released]).to.deep.equal(
      [chain(ethers.keccak256(coder.encode(["address[]"], [R.auditors])), ethers.ZeroHash), 0n]);
    // the close needs the roster's verifiers (and a roster without them takes none)
    await time.increaseTo((await market.getOrder(orderId)).deadline + 1n);
    await expect(market.closeRoster(orderId, R.addrs, R.layout, [], [])).to.be.revertedWithCustomError(market,
      "AuditorsMismatch").withArgs(orderId);
    await expect(market.closeRoster(orderId, R.addrs, R.layout, [v2.address, v1.address], []))
      .to.be.revertedWithCustomError(market, "AuditorsMismatch").withArgs(orderId);
    await closeTx(R);
    for (const v of [v1, v2]) expect(await lockedOf(sys, v)).to.equal(0n);
    await expectSolventLoose(sys);
  });

  it("deferred audits: the operator leaves drawn units pending, one quorum's posting covers every pending round; forged, duplicate, out-of-range, other-order, wrong-record and sub-quorum postings revert; the close refuses pending records",
    async function () {
    const { sys, orderId, R } = await load(auditedFixture);
    const { market } = sys;
    const [v1, v2, v3] = sys.verifiers;
    const p4 = sys.providers[3];
    const digests = R.slots.map((_, i) => h.digestOf(`u${Math.floor(i / 3)}`));
    digests[5] = h.digestOf("other"); // unit 1 split
    await step(R, { commit: 0, digests });
    const before = await chainState(sys, orderId);
    // the operator's step, its verifiers setting the split unit aside, unit 0 pending and posted by `audit`
    const reveal = (audit) => opStep(R, [v1, v2], { reveal: 0, commit: 1, audit });
    const r0 = roundRecordOf(R, 0, 1n); // unit 1 is split: the round's record holds unit 0 only
    // a relayer may leave the drawn unit 0 pending (no posting can pay it without a quorum), but the split unit 1
    // still needs the operator's verifiers
    await expect(step(R, { reveal: 0, commit: 1 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
      .withArgs(orderId, 0, 1, false);
    // a posting signed over another record (both units), by a non-verifier under a verifier's index, one verifier
    // twice, an index out of range, a verifier list not the roster's, another order's message
    await expect(reveal(await postingOf(R, [roundRecordOf(R, 0, 3n)], [v1, v2]))).to.be.revertedWithCustomError(market,
      "InvalidSigner").withArgs(v1.address, anyValue);
    await expect(reveal(await postingOf(R, [r0], [v1, v2], { signerOf: (s) => (s === v2 ? p4 : s) })))
      .to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(v2.address, p4.address);
    await expect(reveal(await postingOf(R, [r0], [v1, v1]))).to.be.revertedWithCustomError(market, "DuplicateParty")
      .withArgs(v1.address);
    await expect(reveal(await postingOf(R, [r0], [v1, v2], { indexOf: (s) => (s === v2 ? 3 : 0) })))
      .to.be.revertedWithCustomError(market, "InvalidLayout").withArgs(3);
    await expect(reveal(await postingOf(R, [r0], [v1, v2], { verifiers: [v1.address, v2.address] })))
      .to.be.revertedWithCustomError(market, "AuditorsMismatch").withArgs(orderId);
    await expect(reveal(await postingOf(R, [r0], [v1, v2], { orderId: orderId + 1n })))
      .to.be.revertedWithCustomError(market, "InvalidSigner").withArgs(v1.address, anyValue);
    // one signature of three is no quorum
    await expect(reveal(await postingOf(R, [r0], [v1]))).to.be.revertedWithCustomError(market, "QuorumNotReached")
      .withArgs(orderId, 1, 2);
    expect(await chainState(sys, orderId)).to.deep.equal(before);
    // a quorum's posting by a relayer covers unit 0, but the split unit 1 still needs the operator
    await expect(step(R, { reveal: 0, commit: 1, audit: await postingOf(R, [r0], [v1, v3]) }))
      .to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict").withArgs(orderId, 0, 1, false);
    // the operator: unit 0 pending (not set aside), the split unit 1 set aside with its verifiers; no posting
    const tx0 = await opStep(R, [v1, v2], { reveal: 0, commit: 1 });
    // with verifiers the operator sets the drawn units aside (as when the verifiers refuse): here it gave them
    // for the split unit, so unit 0 was set aside too
    expect(await setAsideOf(R, tx0)).to.deep.equal([{ round: 0n, unit: 0n, unitId: 1n }, { round: 0n, unit: 1n, unitId: 2n }]);
    await expect(tx0).to.emit(market, "RoundRevealed").withArgs(orderId, 0, unitDigests(R, 0), 0n);
    expect(R.records ?? []).to.deep.equal([]);
    // round 1: the operator's step without verifiers leaves both units pending; no posting yet
    const tx1 = await opStep(R, [], { reveal: 1 });
    await expect(tx1).to.emit(market, "RoundRevealed").withArgs(orderId, 1, unitDigests(R, 1), 3n);
    await expect(tx1).to.not.emit(market, "AuditPosted");
    await expect(tx1).to.not.emit(market, "UnitSetAside");
    expect(R.records).to.deep.equal([roundRecordOf(R, 1, 3n)]);
    expect(await auditCounts(R)).to.deep.equal([0n, 0n, 0n]);
    for (const id of [1n, 2n]) await verdict(sys, id, [0, 0, 0], [v1, v2]);
    // nothing drawn is paid unaudited: the close refuses while a record is pending, even after the deadline
    await expect(closeTx(R)).to.be.revertedWithCustomError(market, "AuditsPending").withArgs(orderId);
    await time.increaseTo((await market.getOrder(orderId)).deadline + 1n);
    await expect(closeTx(R)).to.be.revertedWithCustomError(market, "AuditsPending").withArgs(orderId);
    // a posting alone (no round to reveal, nothing to commit), relayed by anyone: every verifier signs
    const posting = await postingOf(R, [], [v1, v2, v3]);
    await expect(step(R, { audit: { ...posting, signatures: [] } })).to.be.revertedWithCustomError(market, "EmptyBatch");
    const tx2 = await step(R, { audit: posting });
    const info = POSTING | (0b111n << 64n) | ((await timestampOf(tx2)) << 72n);
    await expect(tx2).to.emit(market, "AuditPosted").withArgs(orderId, info, auditChainsOf([roundRecordOf(R, 1, 3n)]).pending);
    expect(await auditCounts(R)).to.deep.equal([2n, 2n, 2n]);
    await expect(step(R, { audit: posting })).to.be.revertedWithCustomError(market, "AuditorsMismatch"); // nothing pending
    // the close waits for the posting's challenge window, then pays each signer FEE / 3 per audited unit
    const until = (await timestampOf(tx2)) + PARAMS.verdictWindow;
    await expect(closeTx(R)).to.be.revertedWithCustomError(market, "RosterNotClosable").withArgs(orderId, until);
    await time.setNextBlockTimestamp(until + 1n);
    const share = FEE / 3n;
    expect(await closeCrediting(R, [v1, v2, v3])).to.deep.equal([2n * share, 2n * share, 2n * share]);
    for (const v of [v1, v2, v3]) expect(await lockedOf(sys, v)).to.equal(0n);
    for (const p of R.signers) expect(await lockedOf(sys, p)).to.equal(0n);
    expect(await orderFields(sys, orderId)).to.deep.equal({ balance: 2n * FEE - 6n * share, delivered: 4n, openUnits: 0n,
      closed: false });
    await expectSolventLoose(sys);

    // a roster opened without verifiers leaves nothing pending and takes no posting
    const plain = await h.postOrder(sys, { units: 4 });
    const P = rosterOf(sys, plain.orderId, sys.providers.slice(0, 3), { rounds: 2 });
    await openRoster(P);
    await step(P, { commit: 0 });
    P.auditors = R.auditors;
    const full = await postingOf(P, [roundRecordOf(P, 0, 3n)], [v1, v2]);
    await expect(step(P, { reveal: 0, audit: full })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict");
    await expect(opStep(P, [v1, v2], { reveal: 0, audit: full })).to.be.revertedWithCustomError(market,
      "AuditorsMismatch").withArgs(plain.orderId);
    const tx = await opStep(P, [v1, v2], { reveal: 0 });
    await expect(tx).to.emit(market, "RoundRevealed").withArgs(plain.orderId, 0, unitDigests(P, 0), 0n);
    expect((await setAsideOf(P, tx)).length).to.equal(2);
  });

  it("deferral across steps: the pending chain rides in the round hash; a step, a commit after a reveal-only step and publishOpening must carry it; the verifiers' refusal of a round sets it aside while earlier rounds stay pending; the challenge window runs from the posting",
    async function () {
    const sys = await h.fundedSystem({ ...PARAMS, spotCheckPpm: 1_000_000 });
    const { market } = sys;
    const [v1, v2, v3] = sys.verifiers;
    const p4 = sys.providers[3];
    const { orderId } = await h.postOrder(sys, { units: 6 });
    const R = rosterOf(sys, orderId, sys.providers.slice(0, 3), { rounds: 3 });
    R.auditors = addrsOf(sys.verifiers);
    await openRoster(R);
    await step(R, { commit: 0 });
    // the operator reveals round 0 alone (no commit): both units pending, the chain stored alone
    const t0 = await timestampOf(await opStep(R, [], { reveal: 0 }));
    const { pending } = auditChainsOf(R.records);
    expect((await rosterState(sys, orderId)).pending).to.equal(chain(ethers.ZeroHash, pending));
    // a commit must carry the pending chain: not none, not another
    await expect(step(R, { commit: 1, audit: { pending: ethers.ZeroHash } })).to.be.revertedWithCustomError(market,
      "AuditMismatch").withArgs(orderId, 1);
    await expect(step(R, { commit: 1, audit: { pending: ethers.id("other") } })).to.be.revertedWithCustomError(market,
      "AuditMismatch").withArgs(orderId, 1);
    await step(R, { commit: 1 });
    expect((await rosterState(sys, orderId)).pending).to.equal(chain(roundHashOf(R, 1), pending));
    // the reveal and publishOpening check it too
    await expect(step(R, { reveal: 1, audit: { pending: ethers.ZeroHash } })).to.be.revertedWithCustomError(market,
      "RoundHashMismatch").withArgs(orderId, 1);
    const d = slotData(R, 1, 0);
    const commitments = R.slots.map((_, i) => slotData(R, 1, i).commitment);
    await expect(market.publishOpening(orderId, R.addrs, R.layout, 0, d.resultDigest, d.salt, commitments, ethers.ZeroHash))
      .to.be.revertedWithCustomError(market, "RoundHashMismatch").withArgs(orderId, 1);
    await expect(market.publishOpening(orderId, R.addrs, R.layout, 0, d.resultDigest, d.salt, commitments, pending))
      .to.emit(market, "OpeningPublished");
    // the verifiers refuse round 1 (say, a known answer missed): the operator's step with verifiers sets its
    // units aside and leaves round 0 pending; a relayer's step could only post, and none covers round 1
    await expect(step(R, { reveal: 1, commit: 2, audit: await postingOf(R, [], [v1, v2]) }))
      .to.be.revertedWithCustomError(market, "InvalidSigner"); // signed over round 0 alone: round 1's was added
    const tx1 = await opStep(R, [v3, p4], { reveal: 1, commit: 2 });
    expect((await setAsideOf(R, tx1)).length).to.equal(2);
    await expect(tx1).to.emit(market, "RoundRevealed").withArgs(orderId, 1, unitDigests(R, 1), 0n);
    expect(R.records.length).to.equal(1);
    for (const id of [1n, 2n]) await verdict(sys, id, [0, 0, 0], [v3, p4]);
    // long after round 0's reveal, the last step reveals round 2 and posts rounds 0 and 2 together
    await time.increaseTo(t0 + 2n * PARAMS.verdictWindow);
    const r2 = roundRecordOf(R, 2, 3n);
    const tx2 = await step(R, { reveal: 2, audit: await postingOf(R, [r2], [v1, v2]) });
    const posted = await timestampOf(tx2);
    expect(await auditCounts(R)).to.deep.equal([4n, 4n, 0n]);
    // round 0's units are challengeable for verdictWindow from the posting that covered them, not from their reveal
    await time.setNextBlockTimestamp(posted + PARAMS.verdictWindow);
    const ctx = await challengeTx(R, 0, 1, R.records[0].info, [v3, p4]);
    await expect(ctx).to.emit(market, "AuditChallenged").withArgs(orderId, 0, 1, 3n, R.records[0].info);
    expect(await market.auditSignersOf(3n)).to.deep.equal([v1.address, v2.address]);
    await time.setNextBlockTimestamp(posted + PARAMS.verdictWindow + 1n);
    await expect(challengeTx(R, 2, 0, R.records[1].info, [v3, p4])).to.be.revertedWithCustomError(market,
      "AuditChallengeClosed").withArgs(orderId, 2, posted + PARAMS.verdictWindow);
    expect(await auditCounts(R)).to.deep.equal([3n, 3n, 0n]);
    await verdict(sys, 3n, [0, 0, 0], [v3, p4]);
    const share = FEE / 3n;
    expect(await closeCrediting(R, [v1, v2, v3])).to.deep.equal([3n * share, 3n * share, 0n]);
    await expectSolventLoose(sys);
  });

  it("a unit with a provider below the roster's streak is never left pending: set aside whatever the posting",
    async function () {
    const sys = await h.fundedSystem({ ...PARAMS, spotCheckPpm: 1_000_000, probationStreak: 1 });
    const { market } = sys;
    const [v1, v2, v3] = sys.verifiers;
    const { orderId } = await h.postOrder(sys, { units: 4 });
    const R = rosterOf(sys, orderId, sys.providers.slice(0, 3), { rounds: 2 });
    R.auditors = addrsOf(sys.verifiers);
    await openRoster(R);
    await step(R, { commit: 0 });
    // every provider is on probation: both units need the operator's verifiers; a posting over them is refused
    const full = await postingOf(R, [roundRecordOf(R, 0, 3n)], [v1, v2, v3]);
    await expect(step(R, { reveal: 0, audit: full })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict")
      .withArgs(orderId, 0, 0, true);
    await expect(opStep(R, [v1, v2], { reveal: 0, audit: full })).to.be.revertedWithCustomError(market,
      "AuditorsMismatch").withArgs(orderId);
    await expect(opStep(R, [], { reveal: 0 })).to.be.revertedWithCustomError(market, "RoundUnitNeedsVerdict");
    const tx = await opStep(R, [v1, v2], { reveal: 0 });
    await expect(tx).to.emit(market, "RoundRevealed").withArgs(orderId, 0, unitDigests(R, 0), 0n);
    expect((await setAsideOf(R, tx)).length).to.equal(2);
    expect(await auditCounts(R)).to.deep.equal([0n, 0n, 0n]);
  });

  it("a lazy audit of a planted cheat: the operator's challenge sets the unit aside, its verdict and truth have fraud, and every signer is slashed",
    async function () {
    const { sys, appeals, orderId, R } = await load(auditedFixture);
    const { market, stakes, buyer } = sys;
    const [v1, v2, v3] = sys.verifiers;
    const p4 = sys.providers[3];
    // a canary: the operator knows unit 0's answer; all three replicas return the same wrong digest
    const digests = R.slots.map((_, i) => (i < 3 ? h.digestOf("planted cheat") : h.digestOf("u1")));
    await step(R, { commit: 0, digests });
    const tx0 = await opStep(R, [], { reveal: 0, commit: 1 });
    await expect(tx0).to.not.emit(market, "UnitSetAside");
    // v1 and v2 sign the posting of both rounds without re-executing; v3 does not sign
    const tx1 = await step(R, { reveal: 1, audit: await postingOf(R, [roundRecordOf(R, 1, 3n)], [v1, v2]) });
    const info0 = R.records[0].info;
    const until0 = (await timestampOf(tx1)) + PARAMS.verdictWindow;
    expect(await auditCounts(R)).to.deep.equal([4n, 4n, 0n]);

    // refusals: not the operator, a record that is not the round's, a signer as the unit's verifier, too few verifiers
    await expect(challengeTx(R, 0, 0, info0, [v3, p4], sys.other)).to.be.revertedWithCustomError(market,
      "AccessControlUnauthorizedAccount").withArgs(sys.other.address, await market.OPERATOR_ROLE());
    await expect(challengeTx(R, 0, 0, info0 ^ 2n, [v3, p4])).to.be.revertedWithCustomError(market,
      "AuditMismatch").withArgs(orderId, 0);
    await expect(challengeTx(R, 0, 0, info0, [v3, p4], undefined, { at: 2n << 8n })).to.be.revertedWithCustomError(market,
      "AuditMismatch").withArgs(orderId, 0); // record 2 is the posting's
    await expect(challengeTx(R, 0, 0, info0, [v1, p4])).to.be.revertedWithCustomError(market, "DuplicateParty")
      .withArgs(v1.address);
    await expect(challengeTx(R, 0, 0, info0, [p4])).to.be.revertedWithCustomError(market, "InvalidVerifierCount");
    await expect(challengeTx(R, 0, 2, info0, [v3, p4])).to.be.revertedWithCustomError(market, "NotAudited")
      .withArgs(orderId, 0, 2);

    const unitId = (await market.unitCount()) + 1n;
    const ctx = await challengeTx(R, 0, 0, info0, [v3, p4]);
    const info0b = info0 | (1n << 112n);
    await expect(ctx).to.emit(market, "AuditChallenged").withArgs(orderId, 0, 0, unitId, info0b);
    await expectSetAside(R, ctx, 0, 0, unitId, [v3, p4]);
    expect(await market.auditSignersOf(unitId)).to.deep.equal([v1.address, v2.address]);
    expect(await market.auditSignersOf(unitId - 1n)).to.deep.equal([]);
    expect(await auditCounts(R)).to.deep.equal([3n, 3n, 0n]);
    expect(await rosterState(sys, orderId)).to.include({ setAsideUnits: 1n, openSetAside: 1n });
    await expect(challengeTx(R, 0, 0, info0b, [v3, p4])).to.be.revertedWithCustomError(market, "NotAudited")
      .withArgs(orderId, 0, 0);
    await expect(challengeTx(R, 0, 0, info0, [v3, p4])).to.be.revertedWithCustomError(market, "AuditMismatch");
    await expectSolventLoose(sys);

    // the challenged unit's verifiers re-execute and call every replica fraud; nobody appeals
    await verdict(sys, unitId, [2, 2, 2], [v3, p4]);
    await expect(appeals.slashRoundAudit(unitId, [2, 2, 2])).to.be.revertedWithCustomError(appeals, "TruthNotFixed");
    await time.increaseTo((await market.getUnit(unitId)).verdictDeadline + h.APPEAL_PARAMS.appealWindow + 1n);
    await appeals.settleVerdict(unitId, [2, 2, 2]);
    expect(await rosterState(sys, orderId)).to.include({ openSetAside: 0n });
    await expect(appeals.slashRoundAudit(unitId, [2, 2, 0])).to.be.revertedWithCustomError(appeals, "OutcomesMismatch");
    const slash = h.APPEAL_PARAMS.verifierSlash;
    const bounty = slash * BigInt(h.APPEAL_PARAMS.bountyBps) / 10_000n;
    const buyerTokens = await sys.token.balanceOf(buyer.address);
    const stx = await appeals.connect(sys.other).slashRoundAudit(unitId, [2, 2, 2]);
    await expect(stx).to.emit(appeals, "VerifierSlashed").withArgs(unitId, v1.address, slash, sys.other.address);
    await expect(stx).to.emit(appeals, "VerifierSlashed").withArgs(unitId, v2.address, slash, sys.other.address);
    expect(await sys.token.balanceOf(sys.other.address)).to.equal(2n * bounty);
    expect(await sys.token.balanceOf(buyer.address)).to.equal(buyerTokens + 2n * (slash - bounty));
    expect(await stakes.bondedOf(v1.address)).to.equal(200n * E18 - slash);
    expect(await stakes.bondedOf(v3.address)).to.equal(200n * E18);
    await expect(appeals.slashRoundAudit(unitId, [2, 2, 2])).to.be.revertedWithCustomError(appeals,
      "VerifierAlreadySlashed");

    // the posting's challenge window is long over: the roster closes; v1, v2 are not paid the challenged unit,
    // v3 (who signed nothing) nothing
    expect(until0).to.be.lessThan(BigInt(await time.latest()));
    const share = FEE / 3n;
    expect(await closeCrediting(R, [v1, v2, v3])).to.deep.equal([3n * share, 3n * share, 0n]);
    for (const v of [v1, v2, v3]) expect(await lockedOf(sys, v)).to.equal(0n);
    await expectSolventLoose(sys);
  });

  /** The lazy audit of auditedFixture's planted cheat, challenged and judged fraud (its truth fixed, nothing
   * held), where v1 also verifies an open per-unit unit (10 more locked) and unstaked down to 30 bonded: its two
   * locks (20) stay backed by a slash of verifierSlash (20) only if the roster's lock is released first. */
  async function slashableAuditFixture() {
    const f = await auditedFixture();
    const { sys, appeals, R } = f;
    const { market, stakes } = sys;
    const [v1, v2, v3] = sys.verifiers;
    const p4 = sys.providers[3];
    const solo = (await h.postOrder(sys, { units: 1, replicas: 1 })).orderId;
    const open = await h.assignUnit(sys, solo, { providers: [p4], verifiers: [v1, v2] });
    await stakes.connect(v1).requestUnstake(170n * E18);
    expect((await stakes.stakeOf(v1.address)).slice(0, 2)).to.deep.equal([30n * E18, 20n * E18]);
    const digests = R.slots.map((_, i) => (i < 3 ? h.digestOf("planted cheat") : h.digestOf("u1")));
    await step(R, { commit: 0, digests });
    await step(R, { reveal: 0, commit: 1, audit: await postingOf(R, [roundRecordOf(R, 0, 3n)], [v1, v2]) });
    await step(R, { reveal: 1, audit: await postingOf(R, [roundRecordOf(R, 1, 3n)], [v1, v2, v3]) });
    const unitId = (await market.unitCount()) + 1n;
    await challengeTx(R, 0, 0, R.records[0].info, [v3, p4]);
    await verdict(sys, unitId, [2, 2, 2], [v3, p4]);
    await time.increaseTo((await market.getUnit(unitId)).verdictDeadline + h.APPEAL_PARAMS.appealWindow + 1n);
    await appeals.settleVerdict(unitId, [2, 2, 2]);
    return { ...f, unitId, open };
  }

  const bondedLocked = async (sys, v) => (await sys.stakes.stakeOf(v.address)).slice(0, 2);

  it("slashRoundAudit before the close releases each signer's roster lock first, once: a signer slashed down to its locks keeps its other unit's lock backed",
    async function () {
    const { sys, appeals, orderId, R, unitId, open } = await load(slashableAuditFixture);
    const { market } = sys;
    const [v1, v2, v3] = sys.verifiers;
    expect(await rosterState(sys, orderId)).to.include({ openSetAside: 0n, closed: false });
    await appeals.slashRoundAudit(unitId, [2, 2, 2]);
    // v1: 30 - 20 bonded; 10 locked, the open unit's (the roster's 10 was released before the slash)
    expect(await bondedLocked(sys, v1)).to.deep.equal([10n * E18, 10n * E18]);
    await closeTx(R);
    // the close releases v3's roster lock only: v1 and v2 keep the open unit's lock, fully backed (before the
    // fix StakeManager capped v1's 20 locked at its 10 bonded and the close released 10 of it: 0 locked)
    expect((await market.getUnit(open.unitId)).state).to.equal(h.UNIT_STATE.Committing);
    expect(await bondedLocked(sys, v1)).to.deep.equal([10n * E18, PARAMS.verifierCollateral]);
    expect(await bondedLocked(sys, v2)).to.deep.equal([180n * E18, PARAMS.verifierCollateral]);
    expect(await bondedLocked(sys, v3)).to.deep.equal([200n * E18, 0n]);
    expect((await market.rosterAuditsOf(orderId)).released).to.equal(3n); // v1, v2
    await expectSolventLoose(sys);
  });

  it("slashRoundAudit after the close releases nothing more: the close released every roster lock", async function () {
    const { sys, appeals, orderId, R, unitId, open } = await load(slashableAuditFixture);
    const { market } = sys;
    const [v1, v2] = sys.verifiers;
    await closeTx(R);
    expect(await bondedLocked(sys, v1)).to.deep.equal([30n * E18, PARAMS.verifierCollateral]);
    await appeals.slashRoundAudit(unitId, [2, 2, 2]);
    expect((await market.getUnit(open.unitId)).state).to.equal(h.UNIT_STATE.Committing);
    expect(await bondedLocked(sys, v1)).to.deep.equal([10n * E18, PARAMS.verifierCollateral]);
    expect(await bondedLocked(sys, v2)).to.deep.equal([180n * E18, PARAMS.verifierCollateral]);
    expect((await market.rosterAuditsOf(orderId)).released).to.equal(0n);
    await expectSolventLoose(sys);
  });

  it("releaseAuditSigners is VerdictAppeals' alone and runs only delegated",
    async function () {
    const { sys, orderId, unitId } = await load(slashableAuditFixture);
    const { market } = sys;
    await expect(market.connect(sys.other).releaseAuditSigners(unitId)).to.be.revertedWithCustomError(market,
      "AccessControlUnauthorizedAccount").withArgs(sys.other.address, await market.APPEALS_ROLE());
    const extension = await ethers.getContractAt("JobMarketExtension", await market.extension());
    await expect(extension.releaseAuditSigners(unitId)).to.be.revertedWithCustomError(extension, "NotDelegated");
    expect((await market.rosterAuditsOf(orderId)).released).to.equal(0n);
  });

  it("a challenge is refused after the posting's window (its step's time + verdictWindow), which the close waits for; a truth without fraud slashes no signer",
    async function () {
    const { sys, appeals, orderId, R } = await load(auditedFixture);
    const { market } = sys;
    const [v1, v2, v3] = sys.verifiers;
    const p4 = sys.providers[3];
    await step(R, { commit: 0 });
    const tx0 = await step(R, { reveal: 0, commit: 1, audit: await postingOf(R, [roundRecordOf(R, 0, 3n)], [v1, v2]) });
    const info0 = R.records[0].info;
    const until0 = (await timestampOf(tx0)) + PARAMS.verdictWindow;
    // a challenge of an honest unit (in the window's last second): its verdict accepts, its truth has no fraud
    const unitId = (await market.unitCount()) + 1n;
    await time.setNextBlockTimestamp(until0);
    const ctx = await challengeTx(R, 0, 1, info0, [v3, p4]);
    await expect(ctx).to.emit(market, "AuditChallenged").withArgs(orderId, 0, 1, unitId, info0 | (2n << 112n));
    await verdict(sys, unitId, [0, 0, 0], [v3, p4]);
    // one second after the window no unit the posting covered can be challenged
    await time.setNextBlockTimestamp(until0 + 1n);
    await expect(challengeTx(R, 0, 0, info0 | (2n << 112n), [v3, p4])).to.be.revertedWithCustomError(market,
      "AuditChallengeClosed").withArgs(orderId, 0, until0);
    await time.increaseTo((await market.getUnit(unitId)).verdictDeadline + h.APPEAL_PARAMS.appealWindow + 1n);
    await expect(appeals.slashRoundAudit(unitId, [0, 0, 0])).to.be.revertedWithCustomError(appeals,
      "AuditNotContradicted").withArgs(unitId);
    expect(await market.auditSignersOf(unitId)).to.deep.equal([v1.address, v2.address]);
    // round 1 posted late: the close waits for its window, to the second
    const tx1 = await step(R, { reveal: 1, audit: await postingOf(R, [roundRecordOf(R, 1, 3n)], [v2, v3]) });
    const until1 = (await timestampOf(tx1)) + PARAMS.verdictWindow;
    await time.setNextBlockTimestamp(until1);
    await expect(closeTx(R, sys.other)).to.be.revertedWithCustomError(market, "RosterNotClosable")
      .withArgs(orderId, until1);
    await time.setNextBlockTimestamp(until1 + 1n);
    await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 2, 9n * PRICE);
    // v1: unit 0 of round 0; v2: unit 0 of round 0 and both of round 1; v3: both of round 1
    expect(await auditCounts(R)).to.deep.equal([1n, 3n, 2n]);
    await expectSolventLoose(sys);
  });

  it("the audit records are the roster's, in order: a step, a challenge or the close that replays, drops, reorders or alters one reverts",
    async function () {
    const { sys, orderId, R } = await load(auditedFixture);
    const { market } = sys;
    const [v1, v2, v3] = sys.verifiers;
    const p4 = sys.providers[3];
    await step(R, { commit: 0 });
    await step(R, { reveal: 0, commit: 1, audit: await postingOf(R, [roundRecordOf(R, 0, 3n)], [v1, v2]) });
    const [r0, p0] = R.records;
    // a posting must give the posted chain so far: not a stale one (before round 0's posting), not it twice
    const round1 = await postingOf(R, [roundRecordOf(R, 1, 3n)], [v2, v3]);
    for (const stale of [ethers.ZeroHash, auditChainsOf([r0, p0, r0, p0]).chain]) {
      await expect(step(R, { reveal: 1, audit: { ...round1, chain: stale } })).to.be.revertedWithCustomError(market,
        "AuditorsMismatch").withArgs(orderId);
    }
    // nor a pending chain that holds a record the roster has not (round 0's again)
    await expect(step(R, { reveal: 1, audit: { ...round1, pending: auditChainsOf([r0]).pending } }))
      .to.be.revertedWithCustomError(market, "RoundHashMismatch").withArgs(orderId, 1);
    await step(R, { reveal: 1, audit: round1 });
    const [, , r1, p1] = R.records;
    // a challenge must give the records from a posting's first round record to the last posting, after the
    // posted chain before them
    await expect(challengeTx(R, 0, 0, r0.info, [v3, p4], undefined, { records: [r0, p0] })).to.be.revertedWithCustomError(
      market, "AuditMismatch").withArgs(orderId, 0); // round 1's records dropped
    await expect(challengeTx(R, 1, 0, r1.info, [v1, p4], undefined, { prefix: ethers.ZeroHash }))
      .to.be.revertedWithCustomError(market, "AuditMismatch").withArgs(orderId, 1); // round 0's posting skipped
    await expect(challengeTx(R, 0, 0, r0.info, [v3, p4], undefined, { records: [r0, p0, r0, p0, r1, p1] }))
      .to.be.revertedWithCustomError(market, "AuditMismatch").withArgs(orderId, 0); // replayed
    await expect(challengeTx(R, 0, 0, r0.info, [v3, p4], undefined, { records: [r1, p1, r0, p0], at: 2n << 8n }))
      .to.be.revertedWithCustomError(market, "AuditMismatch").withArgs(orderId, 0); // reordered
    await expect(challengeTx(R, 0, 0, r0.info, [v3, p4], undefined, { records: [r0, p0, r1] }))
      .to.be.revertedWithCustomError(market, "AuditMismatch").withArgs(orderId, 0); // a posting dropped
    // the close: every record in order, as last updated (a challenge's bit kept), nothing more
    await challengeTx(R, 1, 1, r1.info, [v1, p4]);
    const challenged = R.records[2];
    expect(challenged.info).to.equal(r1.info | (2n << 112n));
    await verdict(sys, await market.unitCount(), [0, 0, 0], [v1, p4]);
    await time.increase(PARAMS.verdictWindow + 1n);
    const inflated = { ...p0, info: p0.info | (0b100n << 64n) }; // v3 counted round 0's units too
    for (const records of [[r0, p0], [challenged, p1, r0, p0], [r0, p0, r1, p1], [r0, p0, challenged, p1, challenged, p1],
      [r0, inflated, challenged, p1], [r0, p0, challenged, p1, r0], []]) {
      await expect(closeTx(R, undefined, records)).to.be.revertedWithCustomError(market, "AuditorsMismatch")
        .withArgs(orderId);
    }
    const share = FEE / 3n;
    // v1: both units of round 0; v2: round 0's two and round 1's unit 0; v3: round 1's unit 0
    expect(await closeCrediting(R, [v1, v2, v3])).to.deep.equal([2n * share, 3n * share, 1n * share]);
    await expectSolventLoose(sys);
  });

  it("the way out of pending audits, by the operator: its verifiers' verdicts settle every pending unit; a posting can no longer pay them; the close pays the rest once",
    async function () {
    const { sys, orderId, R } = await load(auditedFixture);
    const { market, buyer } = sys;
    const [v1, v2, v3] = sys.verifiers;
    const p4 = sys.providers[3];
    await step(R, { commit: 0 });
    await opStep(R, [], { reveal: 0, commit: 1 });
    await opStep(R, [], { reveal: 1 }); // rounds 0 and 1 pending, nothing committed
    expect(R.records).to.deep.equal([roundRecordOf(R, 0, 3n), roundRecordOf(R, 1, 3n)]);
    const stale = await postingOf(R, [], [v1, v2]); // signed over both rounds: never sent
    const before = await chainState(sys, orderId);
    // only the operator chooses verifiers; at least minVerifiers; records, kept chain and commitments must be the roster's
    await expect(setAsidePendingTx(R, 2, [v3, p4], sys.other)).to.be.revertedWithCustomError(market,
      "AccessControlUnauthorizedAccount").withArgs(sys.other.address, await market.OPERATOR_ROLE());
    await expect(setAsidePendingTx(R, 2, [v3])).to.be.revertedWithCustomError(market, "InvalidVerifierCount");
    for (const opts of [{ kept: ethers.id("other") }, { records: [R.records[1]] }, { committed: ethers.id("other") },
      { records: [R.records[1], R.records[0]] }, { records: [{ ...R.records[1], info: R.records[1].info | 4n }] }]) {
      await expect(setAsidePendingTx(R, 2, [v3, p4], undefined, opts)).to.be.revertedWithCustomError(market,
        "AuditMismatch").withArgs(orderId, 2);
    }
    await expect(setAsidePendingTx(R, 2, [v3, p4], undefined, { digests: unitDigests(R, 0) }))
      .to.be.revertedWithCustomError(market, "EntryCountMismatch").withArgs(4, 2);
    const wrong = unitDigests(R, 0).concat(unitDigests(R, 0));
    await expect(setAsidePendingTx(R, 2, [v3, p4], undefined, { digests: wrong })).to.be.revertedWithCustomError(market,
      "AuditMismatch").withArgs(orderId, 1);
    // anyone's drop (no verifiers) waits for the order's deadline and verdictWindow
    const droppable = (await market.getOrder(orderId)).deadline + PARAMS.verdictWindow;
    await expect(setAsidePendingTx(R, 2, [], sys.other)).to.be.revertedWithCustomError(market, "RosterNotClosable")
      .withArgs(orderId, droppable);
    expect(await chainState(sys, orderId)).to.deep.equal(before);
    const tx = await setAsidePendingTx(R, 2, [v3, p4]);
    await expect(tx).to.emit(market, "PendingSetAside").withArgs(orderId, 2);
    expect(await setAsideOf(R, tx)).to.deep.equal([
      { round: 0n, unit: 0n, unitId: 1n }, { round: 0n, unit: 1n, unitId: 2n },
      { round: 1n, unit: 0n, unitId: 3n }, { round: 1n, unit: 1n, unitId: 4n }]);
    for (const id of [1n, 2n, 3n, 4n]) {
      const unit = await market.getUnit(id);
      expect([unit.state, unit.drawn, unit.verifierCount]).to.deep.equal([h.UNIT_STATE.Revealing, true, 2n]);
    }
    expect(R.records).to.deep.equal([]);
    const roster = await rosterState(sys, orderId);
    expect([roster.setAsideUnits, roster.openSetAside]).to.deep.equal([4n, 4n]);
    // nothing pending: the posting signed before is refused, as is a second way out
    await expect(step(R, { audit: stale })).to.be.revertedWithCustomError(market, "AuditorsMismatch").withArgs(orderId);
    await expect(setAsidePendingTx(R, 0, [v3, p4])).to.be.revertedWithCustomError(market, "AuditMismatch")
      .withArgs(orderId, 2);
    await expect(closeTx(R)).to.be.revertedWithCustomError(market, "UnitsStillOpen").withArgs(orderId, 4);
    for (const id of [1n, 2n, 3n, 4n]) await verdict(sys, id, [0, 0, 0], [v3, p4]);
    // every unit was paid by its verdict: the close pays no slot again, and the roster's verifiers nothing
    await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 2, 0n);
    for (const p of R.signers) {
      expect(await earnedOf(market, p.address)).to.equal(4n * PRICE);
      expect(await lockedOf(sys, p)).to.equal(0n);
    }
    for (const v of [v1, v2]) {
      expect(await earnedOf(market, v.address)).to.equal(0n);
      expect(await lockedOf(sys, v)).to.equal(0n);
    }
    expect(await orderFields(sys, orderId)).to.deep.equal({ balance: 0n, delivered: 4n, openUnits: 0n, closed: false });
    await market.connect(buyer).closeOrder(orderId);
    await expectSolventLoose(sys);
  });

  it("a relayer's step leaves drawn units pending (no hasRole): racing the operator's set-aside step it only moves the set-aside to setAsidePending, which keeps the signed earlier round pending for a later posting",
    async function () {
    const sys = await h.fundedSystem({ ...PARAMS, spotCheckPpm: 1_000_000 });
    const { market } = sys;
    const [v1, v2, v3] = sys.verifiers;
    const p4 = sys.providers[3];
    const { orderId } = await h.postOrder(sys, { units: 6 });
    const R = rosterOf(sys, orderId, sys.providers.slice(0, 3), { rounds: 3 });
    R.auditors = addrsOf(sys.verifiers);
    await openRoster(R);
    await step(R, { commit: 0 });
    await opStep(R, [], { reveal: 0, commit: 1 }); // round 0 pending, the verifiers' signatures over it held
    // the verifiers refuse round 1: the operator's step would set it aside with its verifiers; a provider copies the
    // step without them and gets it mined first: round 1 pending, round 2 committed
    const openings = givenOpenings(R, 1);
    const { works, deadline } = await worksFor(R, 2);
    const operatorStep = market.connect(sys.operator).stepRound.populateTransaction(orderId, R.addrs, R.layout, openings,
      0, addrsOf([v3, p4]), deadline, works, { ...NO_AUDIT, ...auditChainsOf(R.records) });
    const tx1 = await market.connect(R.signers[0]).stepRound(orderId, R.addrs, R.layout, openings, 0, [], deadline, works,
      { ...NO_AUDIT, ...auditChainsOf(R.records) });
    await trackAudits(R, tx1);
    await expect(tx1).to.emit(market, "RoundRevealed").withArgs(orderId, 1, unitDigests(R, 1), 3n);
    await expect(tx1).to.not.emit(market, "UnitSetAside");
    await expect(sys.operator.sendTransaction(await operatorStep)).to.be.revertedWithCustomError(market,
      "RoundHashMismatch").withArgs(orderId, 2);
    // the operator takes round 1 alone off the chain (round 2 committed), keeping round 0 pending
    const tx2 = await setAsidePendingTx(R, 1, [v3, p4]);
    expect((await setAsideOf(R, tx2)).map((x) => x.round)).to.deep.equal([1n, 1n]);
    expect(R.records).to.deep.equal([roundRecordOf(R, 0, 3n)]);
    for (const id of [1n, 2n]) await verdict(sys, id, [0, 0, 0], [v3, p4]);
    // a posting that still holds round 1 is refused; the verifiers' posting over rounds 0 and 2 covers them once
    const r2 = roundRecordOf(R, 2, 3n);
    await expect(step(R, { reveal: 2, audit: await postingOf(R, [], [v1, v2],
      { records: [roundRecordOf(R, 0, 3n), roundRecordOf(R, 1, 3n), r2] }) })).to.be.revertedWithCustomError(market,
      "InvalidSigner");
    const tx3 = await step(R, { reveal: 2, audit: await postingOf(R, [r2], [v1, v2]) });
    expect(await auditCounts(R)).to.deep.equal([4n, 4n, 0n]);
    await time.setNextBlockTimestamp((await timestampOf(tx3)) + PARAMS.verdictWindow + 1n);
    const share = FEE / 3n;
    expect(await closeCrediting(R, [v1, v2, v3])).to.deep.equal([4n * share, 4n * share, 0n]);
    for (const p of R.signers) expect(await earnedOf(market, p.address)).to.equal(6n * PRICE); // 4 by count, 2 by verdict
    await expectSolventLoose(sys);
  });

  it("the way out of pending audits, by anyone: a provider pends its own drawn units and the operator vanishes; after the order's deadline and verdictWindow anyone drops them unpaid, and the close releases every lock and returns their budget",
    async function () {
    const { sys, orderId, R } = await load(auditedFixture);
    const { market, buyer } = sys;
    const [v1, v2] = sys.verifiers;
    const [a] = R.signers;
    await step(R, { commit: 0 });
    await step(R, { reveal: 0, commit: 1, caller: a }); // round 0 pending, by a provider; round 1 committed
    expect(R.records).to.deep.equal([roundRecordOf(R, 0, 3n)]);
    const stale = await postingOf(R, [], [v1, v2]);
    const deadline = (await market.getOrder(orderId)).deadline;
    await time.increaseTo(deadline + 1n);
    await expect(closeTx(R)).to.be.revertedWithCustomError(market, "AuditsPending").withArgs(orderId);
    await time.setNextBlockTimestamp(deadline + PARAMS.verdictWindow);
    await expect(setAsidePendingTx(R, 1, [], sys.other)).to.be.revertedWithCustomError(market, "RosterNotClosable")
      .withArgs(orderId, deadline + PARAMS.verdictWindow);
    await time.increaseTo(deadline + PARAMS.verdictWindow + 1n);
    await expect(setAsidePendingTx(R, 1, [], sys.other, { committed: ethers.ZeroHash })).to.be.revertedWithCustomError(
      market, "AuditMismatch").withArgs(orderId, 2);
    const tx = await setAsidePendingTx(R, 1, [], sys.other);
    await expect(tx).to.emit(market, "PendingSetAside").withArgs(orderId, 1);
    expect(await setAsideOf(R, tx)).to.deep.equal([{ round: 0n, unit: 0n, unitId: 0n }, { round: 0n, unit: 1n, unitId: 0n }]);
    expect(await market.unitCount()).to.equal(0n);
    // their budget is back in the order; nothing is left to post
    expect(await orderFields(sys, orderId)).to.deep.equal(
      { balance: 2n * (3n * PRICE + FEE), delivered: 0n, openUnits: 2n, closed: false });
    await expect(step(R, { reveal: 1, audit: stale })).to.be.revertedWithCustomError(market, "InvalidSigner");
    // round 1 never revealed, round 0 dropped: nobody is paid, counted valid or given a streak; every lock released
    await expect(closeTx(R)).to.emit(market, "RosterClosed").withArgs(orderId, 1, 0n);
    for (const p of R.signers) {
      expect(await market.credits(p.address)).to.equal(0n);
      expect(await market.reputationOf(p.address)).to.deep.equal([0n, 0n, 0n, 0n]);
      expect(await lockedOf(sys, p)).to.equal(0n);
    }
    for (const v of sys.verifiers.slice(0, 3)) {
      expect(await earnedOf(market, v.address)).to.equal(0n);
      expect(await lockedOf(sys, v)).to.equal(0n);
    }
    expect(await orderFields(sys, orderId)).to.deep.equal({ balance: ESCROW_4, delivered: 0n, openUnits: 0n, closed: false });
    await expect(market.connect(buyer).closeOrder(orderId)).to.emit(market, "OrderClosed").withArgs(orderId, ESCROW_4);
    await expectSolventLoose(sys);
  });

  it("setAsidePending runs only delegated", async function () {
    const { sys, orderId, R } = await load(auditedFixture);
    const extension = await ethers.getContractAt("JobMarketExtension", await sys.market.extension());
    await expect(extension.setAsidePending(orderId, R.addrs, R.layout, ethers.ZeroHash, [], [], ethers.ZeroHash, []))
      .to.be.revertedWithCustomError(extension, "NotDelegated");
  });
});
