// JobMarket: pull-payment credits, re-entrancy, access control and "every fund can exit".
"use strict";

const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("./chain");
const h = require("./helpers");

const { E18, PRICE, FEE, UNBONDING, ACCEPT, FRAUD } = h;
const UNIT_COST = 3n * PRICE + FEE;

async function finalizedFixture() {
  const f = await h.revealedFixture();
  await f.sys.market.connect(f.sys.operator).finalize(f.unitId);
  return f;
}

async function signWithdraw(sys, account, opts = {}) {
  const nonce = opts.nonce ?? (await sys.market.nonces(account.address));
  const deadline = opts.deadline ?? (await h.farDeadline());
  const signature = await h.signMarket(opts.signer ?? account, sys.market, "WithdrawCredit",
    { account: account.address, nonce, deadline }, opts);
  return { nonce, deadline, signature };
}

describe("JobMarket: withdrawCredit", function () {
  it("pays the whole credit once; a second withdrawal reverts", async function () {
    const { sys, providers } = await loadFixture(finalizedFixture);
    const p = providers[0];
    const tx = sys.market.connect(p).withdrawCredit();
    await expect(tx).to.emit(sys.market, "CreditWithdrawn").withArgs(p.address, PRICE);
    await expect(tx).to.changeTokenBalances(sys.token, [p, sys.market], [PRICE, -PRICE]);
    expect(await sys.market.credits(p.address)).to.equal(0n);
    expect(await sys.market.totalCredits()).to.equal(2n * PRICE);
    await expect(sys.market.connect(p).withdrawCredit())
      .to.be.revertedWithCustomError(sys.market, "NothingToWithdraw").withArgs(p.address);
    await h.expectSolvent(sys);
  });

  it("reverts for an account without credit", async function () {
    const { sys } = await loadFixture(finalizedFixture);
    await expect(sys.market.connect(sys.other).withdrawCredit())
      .to.be.revertedWithCustomError(sys.market, "NothingToWithdraw").withArgs(sys.other.address);
  });

  it("withdrawCreditWithSig: relayed by anyone, pays the account; wrong signer, replay, expiry, other chain rejected",
    async function () {
      const { sys, providers } = await loadFixture(finalizedFixture);
      const p = providers[1];
      const send = (s) => sys.market.connect(sys.other).withdrawCreditWithSig(p.address, s.nonce, s.deadline, s.signature);
      await expect(send(await signWithdraw(sys, p, { signer: sys.other })))
        .to.be.revertedWithCustomError(sys.market, "InvalidSigner").withArgs(p.address, sys.other.address);
      await expect(send(await signWithdraw(sys, p, { chainIdDelta: 1n })))
        .to.be.revertedWithCustomError(sys.market, "InvalidSigner");
      const deadline = (await time.latest()) + 3n;
      const expiring = await signWithdraw(sys, p, { deadline });
      await time.setNextBlockTimestamp(deadline + 1n);
      await expect(send(expiring)).to.be.revertedWithCustomError(sys.market, "SignatureExpired");
      const good = await signWithdraw(sys, p);
      await expect(send(good)).to.changeTokenBalances(sys.token, [p, sys.other], [PRICE, 0n]);
      await expect(send(good)).to.be.revertedWithCustomError(sys.market, "InvalidNonce").withArgs(p.address, 1n, 0n);
      await expect(send(await signWithdraw(sys, p)))
        .to.be.revertedWithCustomError(sys.market, "NothingToWithdraw").withArgs(p.address);
    });
});

describe("JobMarket: re-entrancy", function () {
  async function reentrantFixture() {
    const sys = await h.deploySystem("ReentrantToken");
    await sys.token.mint(sys.buyer.address, 1_000n * E18);
    await sys.token.connect(sys.buyer).approve(await sys.market.getAddress(), ethers.MaxUint256);
    for (const party of [...sys.providers, ...sys.verifiers]) {
      await sys.token.mint(party.address, 1_000n * E18);
      await sys.token.connect(party).approve(await sys.stakes.getAddress(), ethers.MaxUint256);
      await sys.stakes.connect(party).stake(200n * E18);
    }
    return sys;
  }

  it("refuses a malicious token re-entering withdrawCreditWithSig during a withdrawal", async function () {
    const sys = await loadFixture(reentrantFixture);
    const { unitId } = await h.unitAt(sys, "revealed");
    await sys.market.connect(sys.operator).finalize(unitId);
    const p = sys.providers[0];
    const s = await signWithdraw(sys, p);
    await sys.token.setHook(await sys.market.getAddress(), sys.market.interface.encodeFunctionData(
      "withdrawCreditWithSig", [p.address, s.nonce, s.deadline, s.signature]));
    await expect(sys.market.connect(p).withdrawCredit()).to.changeTokenBalance(sys.token, p, PRICE);
    expect(await sys.token.hookCalls()).to.equal(1n);
    expect(await sys.token.lastHookSucceeded()).to.equal(false);
    expect(await sys.token.lastHookReturn()).to.equal(sys.market.interface.getError("ReentrancyGuardReentrantCall").selector);
    expect(await sys.market.nonces(p.address)).to.equal(0n);
    await h.expectSolvent(sys);
  });

  it("refuses a malicious token re-entering during the payment a close makes (closeOrder pays the buyer once)",
    async function () {
    const sys = await loadFixture(reentrantFixture);
    const { orderId } = await h.postOrder(sys, { units: 1 });
    const s = await signWithdraw(sys, sys.buyer);
    await sys.token.setHook(await sys.market.getAddress(), sys.market.interface.encodeFunctionData(
      "withdrawCreditWithSig", [sys.buyer.address, s.nonce, s.deadline, s.signature]));
    await expect(sys.market.connect(sys.buyer).closeOrder(orderId)).to.changeTokenBalance(sys.token, sys.buyer, UNIT_COST);
    expect(await sys.token.hookCalls()).to.equal(1n);
    expect(await sys.token.lastHookSucceeded()).to.equal(false);
    expect(await sys.token.lastHookReturn()).to.equal(sys.market.interface.getError("ReentrancyGuardReentrantCall").selector);
    expect(await sys.market.nonces(sys.buyer.address)).to.equal(0n);
    expect(await sys.market.credits(sys.buyer.address)).to.equal(0n);
    await h.expectSolvent(sys);
  });

  it("refuses re-entry while held fraud is slashed (the slash transfer calls the token)", async function () {
    const sys = await loadFixture(reentrantFixture);
    const appeals = sys.admin; // stands in for VerdictAppeals
    await sys.market.grantRole(await sys.market.APPEALS_ROLE(), appeals.address);
    const { unitId } = await h.unitAt(sys, "revealed", [h.digestOf("a"), h.digestOf("a"), h.digestOf("b")]);
    const outcomes = [ACCEPT, ACCEPT, FRAUD];
    const sigs = [];
    for (const v of sys.verifiers.slice(0, 2)) sigs.push(await h.signVerdict(sys.market, v, unitId, outcomes));
    const s = await signWithdraw(sys, sys.providers[0]);
    await sys.token.setHook(await sys.market.getAddress(), sys.market.interface.encodeFunctionData(
      "withdrawCreditWithSig", [sys.providers[0].address, s.nonce, s.deadline, s.signature]));
    await expect(sys.market.submitVerdict(unitId, outcomes, sigs)).to.emit(sys.market, "FraudHeld");
    expect(await sys.token.hookCalls()).to.equal(0n); // the verdict moved no token: the fraud is held
    await expect(sys.market.connect(appeals).settleHeld(unitId, outcomes, outcomes)).to.emit(sys.market, "ReplicaSlashed");
    expect(await sys.token.hookCalls()).to.equal(1n);
    expect(await sys.token.lastHookSucceeded()).to.equal(false);
    expect(await sys.token.lastHookReturn()).to.equal(sys.market.interface.getError("ReentrancyGuardReentrantCall").selector);
    expect(await sys.market.credits(sys.providers[0].address)).to.equal(PRICE);
    await h.expectSolvent(sys);
  });
});

describe("JobMarket: access control", function () {
  it("only the admin grants roles; only the operator assigns and draws", async function () {
    const { sys, orderId } = await loadFixture(h.orderFixture);
    const role = await sys.market.OPERATOR_ROLE();
    await expect(sys.market.connect(sys.other).grantRole(role, sys.other.address))
      .to.be.revertedWithCustomError(sys.market, "AccessControlUnauthorizedAccount")
      .withArgs(sys.other.address, await sys.market.DEFAULT_ADMIN_ROLE());
    await expect(sys.market.connect(sys.buyer).requestVerification(1n))
      .to.be.revertedWithCustomError(sys.market, "AccessControlUnauthorizedAccount").withArgs(sys.buyer.address, role);
    await expect(sys.market.connect(sys.admin).grantRole(role, sys.other.address))
      .to.emit(sys.market, "RoleGranted").withArgs(role, sys.other.address, sys.admin.address);
    const accepts = [];
    for (const p of sys.providers.slice(0, 3)) accepts.push(await h.signAccept(sys.market, p, orderId, ethers.id("k")));
    await expect(sys.market.connect(sys.other).assign(orderId, ethers.id("k"), sys.providers.slice(0, 3).map((p) => p.address),
      sys.verifiers.map((v) => v.address), accepts)).to.emit(sys.market, "UnitAssigned");
  });

  it("the stake manager refuses lock/unlock/slash from the market's callers (only the market contract holds the role)",
    async function () {
      const { sys } = await loadFixture(h.orderFixture);
      await expect(sys.stakes.connect(sys.operator).slash(sys.providers[0].address, 1n, sys.operator.address))
        .to.be.revertedWithCustomError(sys.stakes, "AccessControlUnauthorizedAccount");
    });
});

describe("JobMarket: every fund can exit after its deadlines", function () {
  async function drain(sys, accounts) {
    for (const a of accounts) {
      if ((await sys.market.credits(a.address)) > 0n) await sys.market.connect(a).withdrawCredit();
      const [bonded, locked, unbonding] = await sys.stakes.stakeOf(a.address);
      expect(locked).to.equal(0n);
      if (bonded > 0n) await sys.stakes.connect(a).requestUnstake(bonded);
      if (bonded + unbonding > 0n) {
        await time.increase(UNBONDING);
        await sys.stakes.connect(a).withdraw();
      }
    }
  }

  it("an abandoned unit expires, the order closes after its deadline, buyer and stakers get everything back",
    async function () {
      const sys = await loadFixture(h.systemFixture);
      const start = await sys.token.balanceOf(sys.buyer.address);
      const { orderId, deadline } = await h.postOrder(sys);
      const { unitId } = await h.assignUnit(sys, orderId); // nobody ever commits
      const { verdictDeadline } = await sys.market.getUnit(unitId);
      await time.increaseTo((verdictDeadline > deadline ? verdictDeadline : deadline) + 1n);
      await sys.market.connect(sys.other).expireUnit(unitId);
      await sys.market.connect(sys.other).closeOrder(orderId); // pays the buyer its refund
      expect(await sys.token.balanceOf(sys.buyer.address)).to.equal(start);
      await drain(sys, [...sys.providers, ...sys.verifiers]);
      expect(await sys.token.balanceOf(await sys.market.getAddress())).to.equal(0n);
      expect(await sys.token.balanceOf(await sys.stakes.getAddress())).to.equal(0n);
      expect(await sys.market.totalEscrow()).to.equal(0n);
      expect(await sys.market.totalCredits()).to.equal(0n);
      expect(await sys.stakes.totalStaked()).to.equal(0n);
    });

  it("after a finalized and a slashed unit, all credits and unslashed stake leave; no token is stuck", async function () {
    const sys = await loadFixture(h.systemFixture);
    const appeals = await h.deployAppeals(sys);
    const { orderId } = await h.postOrder(sys);
    const a = await h.assignUnit(sys, orderId);
    const digests = [h.digestOf("a"), h.digestOf("a"), h.digestOf("a")];
    await h.commitAll(sys, a.unitId, a.providers, digests);
    await h.revealAll(sys, a.unitId, a.providers, digests);
    await sys.market.connect(sys.operator).finalize(a.unitId);
    const b = await h.assignUnit(sys, orderId);
    const bad = [h.digestOf("a"), h.digestOf("a"), h.digestOf("z")];
    await h.commitAll(sys, b.unitId, b.providers, bad);
    await h.revealAll(sys, b.unitId, b.providers, bad);
    const sigs = [];
    for (const v of sys.verifiers.slice(0, 2)) sigs.push(await h.signVerdict(sys.market, v, b.unitId, [0, 0, 2]));
    await sys.market.submitVerdict(b.unitId, [0, 0, 2], sigs);
    await sys.market.connect(sys.buyer).closeOrder(orderId);
    await h.expectSolvent(sys);
    // the fraud is held (collateral locked, price escrowed) until nobody appealed in time; then anyone settles it
    expect((await sys.stakes.stakeOf(b.providers[2].address))[1]).to.equal(h.PARAMS.providerCollateral);
    const [, since] = await sys.market.heldOf(b.unitId);
    await time.increaseTo(since + h.APPEAL_PARAMS.appealWindow + 1n);
    await expect(appeals.connect(sys.other).settleVerdict(b.unitId, [0, 0, 2])).to.emit(sys.market, "ReplicaSlashed");
    expect(await sys.market.totalEscrow()).to.equal(0n);
    await h.expectSolvent(sys);
    await drain(sys, [sys.buyer, ...sys.providers, ...sys.verifiers]);
    expect(await sys.token.balanceOf(await appeals.getAddress())).to.equal(0n);
    expect(await sys.token.balanceOf(await sys.market.getAddress())).to.equal(0n);
    expect(await sys.token.balanceOf(await sys.stakes.getAddress())).to.equal(0n);
    const totalSupply = await sys.token.totalSupply();
    let held = 0n;
    for (const x of [sys.buyer, ...sys.providers, ...sys.verifiers]) held += await sys.token.balanceOf(x.address);
    expect(held).to.equal(totalSupply);
  });
});
