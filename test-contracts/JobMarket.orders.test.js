// JobMarket: deployment, orders, assignment and closing.
"use strict";

const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("./chain");
const h = require("./helpers");

const { E18, PARAMS, PRICE, FEE, UNIT_STATE } = h;
const UNIT_COST = 3n * PRICE + FEE;

describe("JobMarket: deployment", function () {
  it("stores its parameters and roles", async function () {
    const { market, token, stakes, admin, operator } = await loadFixture(h.systemFixture);
    const p = await market.params();
    expect([p.commitWindow, p.revealWindow, p.verdictWindow, p.minVerifiers, p.bountyBps,
      p.providerCollateral, p.slashAmount, p.verifierCollateral]).to.deep.equal([
      PARAMS.commitWindow, PARAMS.revealWindow, PARAMS.verdictWindow, BigInt(PARAMS.minVerifiers),
      BigInt(PARAMS.bountyBps), PARAMS.providerCollateral, PARAMS.slashAmount, PARAMS.verifierCollateral]);
    expect(await market.token()).to.equal(await token.getAddress());
    expect(await market.stakes()).to.equal(await stakes.getAddress());
    expect(await market.hasRole(await market.DEFAULT_ADMIN_ROLE(), admin.address)).to.equal(true);
    expect(await market.hasRole(await market.OPERATOR_ROLE(), operator.address)).to.equal(true);
  });

  it("rejects unusable parameters, each by name", async function () {
    const { market, token, stakes, operator } = await loadFixture(h.systemFixture);
    const otherToken = await ethers.deployContract("VeriToken");
    const t = await token.getAddress();
    const s = await stakes.getAddress();
    // a valid extension, so that each refusal is JobMarket's own check of the named parameter
    const extension = await ethers.deployContract("JobMarketExtension", [t, s, PARAMS]);
    const rounds = await ethers.deployContract("JobMarketRoundsExtension", [t, s, PARAMS]);
    const F = { deploy: (...args) => ethers.deployContract("JobMarket", [...args, extension.target, rounds.target]) };
    const cases = [
      [[await otherToken.getAddress(), s, operator.address, PARAMS], "token"],
      [[t, s, ethers.ZeroAddress, PARAMS], "operator"],
      [[t, s, operator.address, { ...PARAMS, commitWindow: 0n }], "commitWindow"],
      [[t, s, operator.address, { ...PARAMS, revealWindow: 0n }], "revealWindow"],
      [[t, s, operator.address, { ...PARAMS, verdictWindow: 0n }], "verdictWindow"],
      [[t, s, operator.address, { ...PARAMS, commitWindow: 365n * 86400n + 1n }], "commitWindow"],
      [[t, s, operator.address, { ...PARAMS, minVerifiers: 0 }], "minVerifiers"],
      [[t, s, operator.address, { ...PARAMS, minVerifiers: 6 }], "minVerifiers"],
      [[t, s, operator.address, { ...PARAMS, verifierCollateral: 0n }], "verifierCollateral"],
      [[t, s, operator.address, { ...PARAMS, bountyBps: 10_001 }], "bountyBps"],
      [[t, s, operator.address, { ...PARAMS, slashAmount: PARAMS.providerCollateral + 1n }], "slashAmount"],
    ];
    for (const [args, name] of cases) {
      await expect(F.deploy(...args)).to.be.revertedWithCustomError(market, "InvalidParameter").withArgs(name);
    }
  });

  it("refuses an extension deployed with another token, stake manager or parameters, or none", async function () {
    const { market, token, stakes, operator, admin } = await loadFixture(h.systemFixture);
    const t = await token.getAddress();
    const s = await stakes.getAddress();
    const otherToken = await ethers.deployContract("VeriToken");
    const otherStakes = await ethers.deployContract("StakeManager", [await otherToken.getAddress(), 3600n, admin]);
    const extensions = [
      await ethers.deployContract("JobMarketExtension", [await otherToken.getAddress(), await otherStakes.getAddress(), PARAMS]),
      await ethers.deployContract("JobMarketExtension", [t, s, { ...PARAMS, spotCheckPpm: PARAMS.spotCheckPpm + 1 }]),
      await ethers.deployContract("JobMarketExtension", [t, s, { ...PARAMS, verdictWindow: PARAMS.verdictWindow + 1n }]),
    ];
    for (const extension of extensions) {
      await expect(h.deployMarket(t, s, operator.address, PARAMS, extension))
        .to.be.revertedWithCustomError(market, "InvalidParameter").withArgs("extension");
    }
    const noCode = { getAddress: async () => operator.address };
    await expect(h.deployMarket(t, s, operator.address, PARAMS, noCode))
      .to.be.revertedWithCustomError(market, "InvalidParameter").withArgs("extension");
    // the round path's extension is checked the same way
    const otherRounds = await ethers.deployContract("JobMarketRoundsExtension",
      [t, s, { ...PARAMS, verdictWindow: PARAMS.verdictWindow + 1n }]);
    await expect(h.deployMarket(t, s, operator.address, PARAMS, undefined, otherRounds))
      .to.be.revertedWithCustomError(market, "InvalidParameter").withArgs("roundsExtension");
    await expect(h.deployMarket(t, s, operator.address, PARAMS, undefined, noCode))
      .to.be.revertedWithCustomError(market, "InvalidParameter").withArgs("roundsExtension");
    const ok = await h.deployMarket(t, s, operator.address, PARAMS);
    expect(await ok.extension()).to.properAddress;
    expect(await ok.extension()).to.not.equal(await market.extension());
  });
});

describe("JobMarket: postOrder", function () {
  it("escrows units x (replicas x price + verifier fee) and records the order", async function () {
    const sys = await loadFixture(h.systemFixture);
    const deadline = (await time.latest()) + 1000n;
    const tx = sys.market.connect(sys.buyer).postOrder(ethers.id("spec"), 2, 3, PRICE, FEE, deadline);
    await expect(tx).to.emit(sys.market, "OrderPosted")
      .withArgs(1n, sys.buyer.address, ethers.id("spec"), 2n, 3n, PRICE, FEE, deadline, 2n * UNIT_COST);
    await expect(tx).to.changeTokenBalances(sys.token, [sys.buyer, sys.market], [-2n * UNIT_COST, 2n * UNIT_COST]);
    const o = await sys.market.getOrder(1n);
    expect([o.buyer, o.deadline, o.units, o.pricePerReplica, o.verifierFeePerUnit, o.balance, o.delivered,
      o.openUnits, o.replicas, o.closed]).to.deep.equal([
      sys.buyer.address, deadline, 2n, PRICE, FEE, 2n * UNIT_COST, 0n, 0n, 3n, false]);
    expect(await sys.market.orderCount()).to.equal(1n);
    expect(await sys.market.totalEscrow()).to.equal(2n * UNIT_COST);
    await h.expectSolvent(sys);
  });

  it("rejects zero units, 0 or 6 replicas, and a deadline that is not in the future", async function () {
    const sys = await loadFixture(h.systemFixture);
    const m = sys.market.connect(sys.buyer);
    const later = (await time.latest()) + 1000n;
    await expect(m.postOrder(ethers.ZeroHash, 0, 3, PRICE, FEE, later)).to.be.revertedWithCustomError(m, "ZeroUnits");
    await expect(m.postOrder(ethers.ZeroHash, 1, 0, PRICE, FEE, later))
      .to.be.revertedWithCustomError(m, "InvalidReplicaCount").withArgs(0);
    await expect(m.postOrder(ethers.ZeroHash, 1, 6, PRICE, FEE, later))
      .to.be.revertedWithCustomError(m, "InvalidReplicaCount").withArgs(6);
    const now = (await time.latest()) + 1n;
    await time.setNextBlockTimestamp(now);
    await expect(m.postOrder(ethers.ZeroHash, 1, 3, PRICE, FEE, now))
      .to.be.revertedWithCustomError(m, "InvalidDeadline").withArgs(now, now);
  });

  it("rejects an escrow that does not fit 128 bits, and a missing allowance", async function () {
    const sys = await loadFixture(h.systemFixture);
    const later = (await time.latest()) + 1000n;
    await expect(sys.market.connect(sys.buyer).postOrder(ethers.ZeroHash, 1, 1, 2n ** 128n, 0, later))
      .to.be.revertedWithCustomError(sys.market, "SafeCastOverflowedUintDowncast");
    await expect(sys.market.connect(sys.other).postOrder(ethers.ZeroHash, 1, 1, 1n, 0, later))
      .to.be.revertedWithCustomError(sys.token, "ERC20InsufficientAllowance");
  });

  for (const [tokenName, error] of [["ReturnFalseToken", "SafeERC20FailedOperation"],
    ["FeeOnTransferToken", "TransferAmountMismatch"]]) {
    it(`reverts with ${error} on a ${tokenName}`, async function () {
      const sys = await h.deploySystem(tokenName);
      await sys.token.mint(sys.buyer.address, 1000n);
      await sys.token.connect(sys.buyer).approve(await sys.market.getAddress(), ethers.MaxUint256);
      await expect(sys.market.connect(sys.buyer).postOrder(ethers.ZeroHash, 1, 1, 100n, 0, (await time.latest()) + 99n))
        .to.be.revertedWithCustomError(sys.market, error);
    });
  }
});

describe("JobMarket: assign", function () {
  async function assignArgs(sys, orderId, opts = {}) {
    const providers = opts.providers ?? sys.providers.slice(0, 3);
    const unitKey = opts.unitKey ?? ethers.id("unit-key");
    const accepts = [];
    for (const p of providers) {
      accepts.push(await h.signAccept(sys.market, p, orderId, unitKey, { deadline: opts.acceptDeadline }));
    }
    return [orderId, unitKey, providers.map((p) => p.address), (opts.verifiers ?? sys.verifiers).map((v) => v.address),
      opts.accepts ?? accepts];
  }

  it("creates a unit and locks each provider's and each verifier's collateral", async function () {
    const { sys, orderId } = await loadFixture(h.orderFixture);
    const args = await assignArgs(sys, orderId);
    const now = (await time.latest()) + 5n;
    await time.setNextBlockTimestamp(now);
    await expect(sys.market.connect(sys.operator).assign(...args)).to.emit(sys.market, "UnitAssigned")
      .withArgs(1n, orderId, args[1], args[2], args[3], now + PARAMS.commitWindow);
    const u = await sys.market.getUnit(1n);
    expect([u.orderId, u.state, u.replicas, u.verifierCount, u.committedMask, u.revealedMask, u.drawn,
      u.commitDeadline, u.revealDeadline, u.verdictDeadline]).to.deep.equal([
      orderId, UNIT_STATE.Committing, 3n, 3n, 0n, 0n, false, now + PARAMS.commitWindow,
      now + PARAMS.commitWindow + PARAMS.revealWindow,
      now + PARAMS.commitWindow + PARAMS.revealWindow + PARAMS.verdictWindow]);
    for (let i = 0; i < 3; i++) {
      const p = sys.providers[i];
      expect(await sys.market.replicaOf(1n, i)).to.deep.equal([p.address, ethers.ZeroHash, false, false]);
      expect((await sys.stakes.stakeOf(p.address))[1]).to.equal(PARAMS.providerCollateral);
    }
    for (const v of sys.verifiers) expect((await sys.stakes.stakeOf(v.address))[1]).to.equal(PARAMS.verifierCollateral);
    expect(await sys.market.verifiersOf(1n)).to.deep.equal(sys.verifiers.map((v) => v.address));
    const o = await sys.market.getOrder(orderId);
    expect([o.balance, o.openUnits]).to.deep.equal([UNIT_COST, 1n]);
    expect(await sys.market.unitCount()).to.equal(1n);
    await expect(sys.market.replicaOf(1n, 3)).to.be.revertedWithCustomError(sys.market, "ReplicaIndexOutOfRange")
      .withArgs(1n, 3n);
    await h.expectSolvent(sys);
  });

  it("stores and reads back 5 providers and 5 verifiers (addresses packed across storage words)", async function () {
    const sys = await loadFixture(h.systemFixture);
    const extra = (await ethers.getSigners()).slice(11, 18);
    for (const s of extra) {
      await sys.token.mint(s.address, 1_000n * E18);
      await sys.token.connect(s).approve(await sys.stakes.getAddress(), ethers.MaxUint256);
      await sys.stakes.connect(s).stake(200n * E18);
    }
    const providers = [...sys.providers, extra[0]];
    const verifiers = [...sys.verifiers, extra[1], extra[2]];
    const { orderId } = await h.postOrder(sys, { replicas: 5 });
    const { unitId } = await h.assignUnit(sys, orderId, { providers, verifiers });
    for (let i = 0; i < 5; i++) expect((await sys.market.replicaOf(unitId, i))[0]).to.equal(providers[i].address);
    expect(await sys.market.verifiersOf(unitId)).to.deep.equal(verifiers.map((v) => v.address));
    // Every party can act in its role: the last provider commits, the last verifiers' signatures count
    // (a majority of five is three).
    await h.commitAll(sys, unitId, providers, providers.map(() => h.digestOf("d")));
    await h.revealAll(sys, unitId, providers, providers.map(() => h.digestOf("d")));
    const outcomes = [0, 0, 0, 0, 0];
    const sigs = [];
    for (const v of verifiers.slice(2)) sigs.push(await h.signVerdict(sys.market, v, unitId, outcomes));
    await expect(sys.market.submitVerdict(unitId, outcomes, sigs)).to.emit(sys.market, "VerdictRecorded");
    expect(await sys.market.credits(extra[2].address)).to.equal(FEE / 3n);
  });

  it("is operator-only", async function () {
    const { sys, orderId } = await loadFixture(h.orderFixture);
    const args = await assignArgs(sys, orderId);
    await expect(sys.market.connect(sys.other).assign(...args))
      .to.be.revertedWithCustomError(sys.market, "AccessControlUnauthorizedAccount")
      .withArgs(sys.other.address, await sys.market.OPERATOR_ROLE());
  });

  it("rejects an unknown, a closed and an expired order", async function () {
    const { sys, orderId, deadline } = await loadFixture(h.orderFixture);
    const op = sys.market.connect(sys.operator);
    await expect(op.assign(...(await assignArgs(sys, 99n)))).to.be.revertedWithCustomError(op, "UnknownOrder").withArgs(99n);
    const args = await assignArgs(sys, orderId);
    await time.setNextBlockTimestamp(deadline + 1n);
    await expect(op.assign(...args)).to.be.revertedWithCustomError(op, "OrderExpired").withArgs(orderId, deadline);
    await sys.market.connect(sys.buyer).closeOrder(orderId);
    await expect(op.assign(...args)).to.be.revertedWithCustomError(op, "OrderNotOpen").withArgs(orderId);
  });

  it("assigns at the order deadline second", async function () {
    const { sys, orderId, deadline } = await loadFixture(h.orderFixture);
    const args = await assignArgs(sys, orderId, { acceptDeadline: deadline });
    await time.setNextBlockTimestamp(deadline);
    await expect(sys.market.connect(sys.operator).assign(...args)).to.emit(sys.market, "UnitAssigned");
  });

  it("checks provider, acceptance and verifier counts", async function () {
    const { sys, orderId } = await loadFixture(h.orderFixture);
    const op = sys.market.connect(sys.operator);
    const two = await assignArgs(sys, orderId, { providers: sys.providers.slice(0, 2) });
    await expect(op.assign(...two)).to.be.revertedWithCustomError(op, "ProviderCountMismatch").withArgs(3n, 2n);
    const args = await assignArgs(sys, orderId);
    await expect(op.assign(args[0], args[1], args[2], args[3], args[4].slice(0, 2)))
      .to.be.revertedWithCustomError(op, "ProviderCountMismatch").withArgs(3n, 2n);
    await expect(op.assign(args[0], args[1], args[2], args[3].slice(0, 1), args[4]))
      .to.be.revertedWithCustomError(op, "InvalidVerifierCount").withArgs(1n, 2n, 5n);
    const six = [...args[3], ...(await ethers.getSigners()).slice(12, 15).map((s) => s.address)];
    await expect(op.assign(args[0], args[1], args[2], six, args[4]))
      .to.be.revertedWithCustomError(op, "InvalidVerifierCount").withArgs(6n, 2n, 5n);
  });

  it("rejects duplicate parties: a provider twice, a verifier twice, a provider as verifier", async function () {
    const { sys, orderId } = await loadFixture(h.orderFixture);
    const op = sys.market.connect(sys.operator);
    const [p1, p2] = sys.providers;
    const dupProviders = await assignArgs(sys, orderId, { providers: [p1, p2, p1] });
    await expect(op.assign(...dupProviders)).to.be.revertedWithCustomError(op, "DuplicateParty").withArgs(p1.address);
    const args = await assignArgs(sys, orderId);
    const [v1, v2] = sys.verifiers;
    await expect(op.assign(args[0], args[1], args[2], [v1.address, v2.address, v1.address], args[4]))
      .to.be.revertedWithCustomError(op, "DuplicateParty").withArgs(v1.address);
    await expect(op.assign(args[0], args[1], args[2], [v1.address, p2.address], args[4]))
      .to.be.revertedWithCustomError(op, "DuplicateParty").withArgs(p2.address);
  });

  it("requires verifiers and providers with free collateral", async function () {
    const { sys, orderId } = await loadFixture(h.orderFixture);
    const op = sys.market.connect(sys.operator);
    const args = await assignArgs(sys, orderId);
    await expect(op.assign(args[0], args[1], args[2], [sys.verifiers[0].address, sys.other.address], args[4]))
      .to.be.revertedWithCustomError(sys.stakes, "InsufficientFreeStake")
      .withArgs(sys.other.address, 0n, PARAMS.verifierCollateral);
    // p1 unstakes so that less than the collateral stays free.
    const p1 = sys.providers[0];
    await sys.stakes.connect(p1).requestUnstake(150n * E18);
    await expect(op.assign(...args)).to.be.revertedWithCustomError(sys.stakes, "InsufficientFreeStake")
      .withArgs(p1.address, 50n * E18, PARAMS.providerCollateral);
  });

  it("rejects a wrong signer, a reused nonce, an expired acceptance and another chain id or contract",
    async function () {
      const { sys, orderId } = await loadFixture(h.orderFixture);
      const op = sys.market.connect(sys.operator);
      const [p1, p2, p3] = sys.providers;
      const key = ethers.id("k");
      const base = async (p1Accept) => [orderId, key, [p1, p2, p3].map((p) => p.address),
        sys.verifiers.map((v) => v.address),
        [p1Accept, await h.signAccept(sys.market, p2, orderId, key), await h.signAccept(sys.market, p3, orderId, key)]];

      await expect(op.assign(...(await base(await h.signAccept(sys.market, p1, orderId, key, { signer: sys.other })))))
        .to.be.revertedWithCustomError(op, "InvalidSigner").withArgs(p1.address, sys.other.address);
      await expect(op.assign(...(await base(await h.signAccept(sys.market, p1, orderId, key, { chainIdDelta: 1n })))))
        .to.be.revertedWithCustomError(op, "InvalidSigner");
      await expect(op.assign(...(await base(await h.signAccept(sys.market, p1, orderId, key,
        { contract: sys.stakes })))))
        .to.be.revertedWithCustomError(op, "InvalidSigner");
      await expect(op.assign(...(await base(await h.signAccept(sys.market, p1, orderId, ethers.id("other key"))))))
        .to.be.revertedWithCustomError(op, "InvalidSigner");
      const malformed = { ...(await h.signAccept(sys.market, p1, orderId, key)), signature: "0x1234" };
      await expect(op.assign(...(await base(malformed))))
        .to.be.revertedWithCustomError(op, "InvalidSigner").withArgs(p1.address, ethers.ZeroAddress);

      const deadline = (await time.latest()) + 10n;
      const expiring = await h.signAccept(sys.market, p1, orderId, key, { deadline });
      const expiringArgs = await base(expiring);
      await time.setNextBlockTimestamp(deadline + 1n);
      await expect(op.assign(...expiringArgs))
        .to.be.revertedWithCustomError(op, "SignatureExpired").withArgs(deadline, deadline + 1n);

      const good = await h.signAccept(sys.market, p1, orderId, key);
      await op.assign(...(await base(good)));
      await expect(op.assign(...(await base(good))))
        .to.be.revertedWithCustomError(op, "AcceptNonceUsed").withArgs(p1.address, good.nonce);
    });

  it("takes one provider's concurrent acceptances in any order (unordered nonces)", async function () {
    const sys = await loadFixture(h.systemFixture);
    const { orderId } = await h.postOrder(sys, { units: 2 });
    const op = sys.market.connect(sys.operator);
    const [p1, p2, p3] = sys.providers;
    const verifiers = sys.verifiers.map((v) => v.address);
    // Both acceptances of every provider are signed before either is relayed; the later nonce lands first.
    const signed = [];
    for (const key of [ethers.id("first"), ethers.id("second")]) {
      const accepts = [];
      for (const p of [p1, p2, p3]) accepts.push(await h.signAccept(sys.market, p, orderId, key));
      signed.push([orderId, key, [p1, p2, p3].map((p) => p.address), verifiers, accepts]);
    }
    await expect(op.assign(...signed[1])).to.emit(sys.market, "UnitAssigned");
    await expect(op.assign(...signed[0])).to.emit(sys.market, "UnitAssigned");
    expect(await sys.market.unitCount()).to.equal(2n);
  });

  it("stops at the order's unit count", async function () {
    const sys = await loadFixture(h.systemFixture);
    const { orderId } = await h.postOrder(sys, { units: 1 });
    await h.assignUnit(sys, orderId);
    const args = await assignArgs(sys, orderId, { providers: [sys.providers[3], ...sys.providers.slice(0, 2)] });
    await expect(sys.market.connect(sys.operator).assign(...args))
      .to.be.revertedWithCustomError(sys.market, "NoUnitBudget").withArgs(orderId);
  });
});

describe("JobMarket: requestVerification", function () {
  it("flags an open unit (operator only, idempotent) and refuses settled or unknown units", async function () {
    const { sys, unitId } = await loadFixture(h.revealedFixture);
    await expect(sys.market.connect(sys.other).requestVerification(unitId))
      .to.be.revertedWithCustomError(sys.market, "AccessControlUnauthorizedAccount");
    const op = sys.market.connect(sys.operator);
    await expect(op.requestVerification(unitId)).to.emit(sys.market, "VerificationRequested").withArgs(unitId);
    await expect(op.requestVerification(unitId)).to.emit(sys.market, "VerificationRequested").withArgs(unitId);
    expect((await sys.market.getUnit(unitId)).drawn).to.equal(true);
    await expect(op.requestVerification(77n)).to.be.revertedWithCustomError(op, "InvalidUnitState").withArgs(77n, 0);
    const { sys: sys2, unitId: u2 } = await loadFixture(h.revealedFixture);
    await sys2.market.connect(sys2.operator).finalize(u2);
    await expect(sys2.market.connect(sys2.operator).requestVerification(u2))
      .to.be.revertedWithCustomError(sys2.market, "UnitAlreadySettled").withArgs(u2);
  });
});

describe("JobMarket: closeOrder", function () {
  it("lets the buyer close at any time and pays it the whole balance", async function () {
    const { sys, orderId } = await loadFixture(h.orderFixture);
    const closed = sys.market.connect(sys.buyer).closeOrder(orderId);
    await expect(closed).to.emit(sys.market, "OrderClosed").withArgs(orderId, 2n * UNIT_COST);
    await expect(closed).to.emit(sys.market, "CreditWithdrawn").withArgs(sys.buyer.address, 2n * UNIT_COST);
    await expect(closed).to.changeTokenBalance(sys.token, sys.buyer, 2n * UNIT_COST);
    expect(await sys.market.credits(sys.buyer.address)).to.equal(0n);
    expect(await sys.market.totalCredits()).to.equal(0n);
    expect(await sys.market.totalEscrow()).to.equal(0n);
    expect((await sys.market.getOrder(orderId)).closed).to.equal(true);
    await expect(sys.market.connect(sys.buyer).closeOrder(orderId))
      .to.be.revertedWithCustomError(sys.market, "OrderNotOpen").withArgs(orderId);
    await h.expectSolvent(sys);
  });

  it("lets anyone else close only after the deadline (T refused, T+1 accepted)", async function () {
    const { sys, orderId, deadline } = await loadFixture(h.orderFixture);
    await time.setNextBlockTimestamp(deadline);
    await expect(sys.market.connect(sys.other).closeOrder(orderId))
      .to.be.revertedWithCustomError(sys.market, "OrderNotClosable").withArgs(orderId, deadline);
    await time.setNextBlockTimestamp(deadline + 1n);
    const closed = sys.market.connect(sys.other).closeOrder(orderId);
    await expect(closed).to.emit(sys.market, "OrderClosed");
    await expect(closed).to.changeTokenBalances(sys.token, [sys.buyer, sys.other], [2n * UNIT_COST, 0n]);
    expect(await sys.market.credits(sys.buyer.address)).to.equal(0n);
    expect(await sys.market.credits(sys.other.address)).to.equal(0n);
  });

  it("refuses while a unit is open, and unknown orders", async function () {
    const { sys, orderId } = await loadFixture(h.assignedFixture);
    await expect(sys.market.connect(sys.buyer).closeOrder(orderId))
      .to.be.revertedWithCustomError(sys.market, "UnitsStillOpen").withArgs(orderId, 1n);
    await expect(sys.market.closeOrder(42n)).to.be.revertedWithCustomError(sys.market, "UnknownOrder").withArgs(42n);
  });
});
