"use strict";

const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("./chain");
const { E18, UNBONDING, signStakes } = require("./helpers");

async function stakesFixture(tokenName = "VeriToken") {
  const [admin, market, alice, bob, relayer, mallory] = await ethers.getSigners();
  const token = await ethers.deployContract(tokenName);
  const stakes = await ethers.deployContract("StakeManager", [await token.getAddress(), UNBONDING, admin.address]);
  await stakes.grantRole(await stakes.MARKET_ROLE(), market.address);
  for (const who of [alice, bob]) {
    await token.mint(who.address, 1_000n * E18);
    await token.connect(who).approve(await stakes.getAddress(), ethers.MaxUint256);
  }
  return { token, stakes, admin, market, alice, bob, relayer, mallory };
}
const veriFixture = () => stakesFixture("VeriToken");

async function stakedFixture() {
  const f = await veriFixture();
  await f.stakes.connect(f.alice).stake(100n * E18);
  return f;
}

async function unstakeSig(f, signer, amount, opts = {}) {
  const nonce = opts.nonce ?? (await f.stakes.nonces(f.alice.address));
  const deadline = opts.deadline ?? (await time.latest()) + 1000n;
  const signature = await signStakes(signer, f.stakes, "RequestUnstake",
    { staker: f.alice.address, amount, nonce, deadline }, opts);
  return { nonce, deadline, signature };
}

async function withdrawSig(f, signer, opts = {}) {
  const nonce = opts.nonce ?? (await f.stakes.nonces(f.alice.address));
  const deadline = opts.deadline ?? (await time.latest()) + 1000n;
  const signature = await signStakes(signer, f.stakes, "Withdraw", { staker: f.alice.address, nonce, deadline }, opts);
  return { nonce, deadline, signature };
}

async function expectSolvent(f) {
  expect(await f.token.balanceOf(await f.stakes.getAddress())).to.be.gte(await f.stakes.totalStaked());
}

describe("StakeManager", function () {
  describe("constructor", function () {
    it("rejects a zero token, a zero unbonding period and a zero admin", async function () {
      const { token, admin, stakes } = await loadFixture(veriFixture);
      const F = await ethers.getContractFactory("StakeManager");
      await expect(F.deploy(ethers.ZeroAddress, UNBONDING, admin.address))
        .to.be.revertedWithCustomError(stakes, "InvalidParameter").withArgs("token");
      await expect(F.deploy(await token.getAddress(), 0, admin.address))
        .to.be.revertedWithCustomError(stakes, "InvalidParameter").withArgs("unbondingPeriod");
      await expect(F.deploy(await token.getAddress(), UNBONDING, ethers.ZeroAddress))
        .to.be.revertedWithCustomError(stakes, "InvalidParameter").withArgs("admin");
    });

    it("exposes its token, unbonding period and admin", async function () {
      const { token, stakes, admin } = await loadFixture(veriFixture);
      expect(await stakes.token()).to.equal(await token.getAddress());
      expect(await stakes.unbondingPeriod()).to.equal(UNBONDING);
      expect(await stakes.hasRole(await stakes.DEFAULT_ADMIN_ROLE(), admin.address)).to.equal(true);
    });
  });

  describe("stake", function () {
    it("bonds tokens and counts them in totalStaked", async function () {
      const f = await loadFixture(veriFixture);
      const tx = f.stakes.connect(f.alice).stake(10n * E18);
      await expect(tx).to.emit(f.stakes, "Staked").withArgs(f.alice.address, 10n * E18);
      await expect(tx).to.changeTokenBalances(f.token, [f.alice, f.stakes], [-10n * E18, 10n * E18]);
      expect(await f.stakes.stakeOf(f.alice.address)).to.deep.equal([10n * E18, 0n, 0n, 0n]);
      expect(await f.stakes.freeStake(f.alice.address)).to.equal(10n * E18);
      expect(await f.stakes.bondedOf(f.alice.address)).to.equal(10n * E18);
      expect(await f.stakes.totalStaked()).to.equal(10n * E18);
    });

    it("rejects zero and a missing allowance", async function () {
      const f = await loadFixture(veriFixture);
      await expect(f.stakes.connect(f.alice).stake(0)).to.be.revertedWithCustomError(f.stakes, "ZeroAmount");
      await expect(f.stakes.connect(f.relayer).stake(1))
        .to.be.revertedWithCustomError(f.token, "ERC20InsufficientAllowance");
    });

    it("stakes with a permit relayed by anyone, and rejects a permit signed by someone else", async function () {
      const f = await loadFixture(veriFixture);
      const deadline = (await time.latest()) + 1000n;
      const { chainId } = await ethers.provider.getNetwork();
      const permit = async (signer) => ethers.Signature.from(await signer.signTypedData(
        { name: "Veritrain Token", version: "1", chainId, verifyingContract: await f.token.getAddress() },
        { Permit: [
          { name: "owner", type: "address" }, { name: "spender", type: "address" },
          { name: "value", type: "uint256" }, { name: "nonce", type: "uint256" }, { name: "deadline", type: "uint256" }] },
        { owner: f.alice.address, spender: await f.stakes.getAddress(), value: 5n * E18, nonce: 0n, deadline },
      ));
      const bad = await permit(f.mallory);
      await expect(f.stakes.connect(f.relayer).stakeWithPermit(f.alice.address, 5n * E18, deadline, bad.v, bad.r, bad.s))
        .to.be.revertedWithCustomError(f.token, "ERC2612InvalidSigner");
      const good = await permit(f.alice);
      await expect(f.stakes.connect(f.relayer).stakeWithPermit(f.alice.address, 5n * E18, deadline, good.v, good.r, good.s))
        .to.emit(f.stakes, "Staked").withArgs(f.alice.address, 5n * E18);
      expect(await f.stakes.bondedOf(f.alice.address)).to.equal(5n * E18);
    });

    it("reverts on a token that returns false (SafeERC20)", async function () {
      const f = await stakesFixture("ReturnFalseToken");
      await expect(f.stakes.connect(f.alice).stake(1n))
        .to.be.revertedWithCustomError(f.stakes, "SafeERC20FailedOperation").withArgs(await f.token.getAddress());
    });

    it("rejects a fee-on-transfer token instead of booking more than it received", async function () {
      const f = await stakesFixture("FeeOnTransferToken");
      await expect(f.stakes.connect(f.alice).stake(100n))
        .to.be.revertedWithCustomError(f.stakes, "TransferAmountMismatch").withArgs(100n, 99n);
    });
  });

  describe("requestUnstake", function () {
    it("moves free stake to unbonding and restarts the thaw timer on each request", async function () {
      const f = await loadFixture(stakedFixture);
      const t1 = (await time.latest()) + 10n;
      await time.setNextBlockTimestamp(t1);
      await expect(f.stakes.connect(f.alice).requestUnstake(30n * E18))
        .to.emit(f.stakes, "UnstakeRequested").withArgs(f.alice.address, 30n * E18, t1 + UNBONDING);
      const t2 = t1 + 100n;
      await time.setNextBlockTimestamp(t2);
      await f.stakes.connect(f.alice).requestUnstake(20n * E18);
      expect(await f.stakes.stakeOf(f.alice.address)).to.deep.equal([50n * E18, 0n, 50n * E18, t2 + UNBONDING]);
      expect(await f.stakes.totalStaked()).to.equal(100n * E18);
    });

    it("refuses to unstake below the locked collateral, and zero", async function () {
      const f = await loadFixture(stakedFixture);
      await f.stakes.connect(f.market).lock(f.alice.address, 80n * E18);
      await expect(f.stakes.connect(f.alice).requestUnstake(21n * E18))
        .to.be.revertedWithCustomError(f.stakes, "InsufficientFreeStake").withArgs(f.alice.address, 20n * E18, 21n * E18);
      await expect(f.stakes.connect(f.alice).requestUnstake(0)).to.be.revertedWithCustomError(f.stakes, "ZeroAmount");
      await f.stakes.connect(f.alice).requestUnstake(20n * E18);
      expect(await f.stakes.freeStake(f.alice.address)).to.equal(0n);
    });
  });

  describe("requestUnstakeWithSig", function () {
    it("accepts the staker's signature relayed by anyone", async function () {
      const f = await loadFixture(stakedFixture);
      const s = await unstakeSig(f, f.alice, 10n * E18);
      await expect(f.stakes.connect(f.relayer).requestUnstakeWithSig(f.alice.address, 10n * E18, s.nonce, s.deadline, s.signature))
        .to.emit(f.stakes, "UnstakeRequested");
      expect(await f.stakes.nonces(f.alice.address)).to.equal(1n);
    });

    it("rejects a wrong signer, a replayed nonce, an expired deadline and another chain id", async function () {
      const f = await loadFixture(stakedFixture);
      const amount = 10n * E18;
      const call = (s) => f.stakes.connect(f.relayer).requestUnstakeWithSig(f.alice.address, amount, s.nonce, s.deadline, s.signature);

      const byMallory = await unstakeSig(f, f.mallory, amount);
      await expect(call(byMallory)).to.be.revertedWithCustomError(f.stakes, "InvalidSigner")
        .withArgs(f.alice.address, f.mallory.address);

      const otherChain = await unstakeSig(f, f.alice, amount, { chainIdDelta: 1n });
      await expect(call(otherChain)).to.be.revertedWithCustomError(f.stakes, "InvalidSigner");

      const good = await unstakeSig(f, f.alice, amount);
      await call(good);
      await expect(call(good)).to.be.revertedWithCustomError(f.stakes, "InvalidNonce").withArgs(f.alice.address, 1n, 0n);

      const expiring = await unstakeSig(f, f.alice, amount, { deadline: (await time.latest()) + 5n });
      await time.setNextBlockTimestamp(expiring.deadline + 1n);
      await expect(call(expiring)).to.be.revertedWithCustomError(f.stakes, "SignatureExpired")
        .withArgs(expiring.deadline, expiring.deadline + 1n);
    });

    it("accepts a signature at its deadline second (T) but not at T+1", async function () {
      const f = await loadFixture(stakedFixture);
      const s = await unstakeSig(f, f.alice, 1n, { deadline: (await time.latest()) + 50n });
      await time.setNextBlockTimestamp(s.deadline);
      await expect(f.stakes.requestUnstakeWithSig(f.alice.address, 1n, s.nonce, s.deadline, s.signature))
        .to.emit(f.stakes, "UnstakeRequested");
      const next = await unstakeSig(f, f.alice, 1n, { deadline: s.deadline + 50n });
      await time.setNextBlockTimestamp(next.deadline + 1n);
      await expect(f.stakes.requestUnstakeWithSig(f.alice.address, 1n, next.nonce, next.deadline, next.signature))
        .to.be.revertedWithCustomError(f.stakes, "SignatureExpired").withArgs(next.deadline, next.deadline + 1n);
    });
  });

  describe("withdraw", function () {
    async function unbondingFixture() {
      const f = await stakedFixture();
      await f.stakes.connect(f.alice).requestUnstake(40n * E18);
      const [, , , thawAt] = await f.stakes.stakeOf(f.alice.address);
      return { ...f, thawAt };
    }

    it("pays out thawed stake at thawAt, not at thawAt-1, and only once", async function () {
      const f = await loadFixture(unbondingFixture);
      await time.setNextBlockTimestamp(f.thawAt - 1n);
      await expect(f.stakes.connect(f.alice).withdraw())
        .to.be.revertedWithCustomError(f.stakes, "StakeStillThawing").withArgs(f.alice.address, f.thawAt);
      await time.setNextBlockTimestamp(f.thawAt);
      const tx = f.stakes.connect(f.alice).withdraw();
      await expect(tx).to.emit(f.stakes, "StakeWithdrawn").withArgs(f.alice.address, 40n * E18);
      await expect(tx).to.changeTokenBalances(f.token, [f.alice, f.stakes], [40n * E18, -40n * E18]);
      await expect(f.stakes.connect(f.alice).withdraw())
        .to.be.revertedWithCustomError(f.stakes, "NothingToWithdraw").withArgs(f.alice.address);
      expect(await f.stakes.totalStaked()).to.equal(60n * E18);
      await expectSolvent(f);
    });

    it("reverts when nothing is unbonding", async function () {
      const f = await loadFixture(stakedFixture);
      await expect(f.stakes.connect(f.bob).withdraw())
        .to.be.revertedWithCustomError(f.stakes, "NothingToWithdraw").withArgs(f.bob.address);
    });

    it("withdrawWithSig pays the staker, relayed by anyone; rejects replays, wrong signers, other chains, expiry",
      async function () {
        const f = await loadFixture(unbondingFixture);
        await time.increaseTo(f.thawAt);
        const call = (s) => f.stakes.connect(f.relayer).withdrawWithSig(f.alice.address, s.nonce, s.deadline, s.signature);
        await expect(call(await withdrawSig(f, f.mallory))).to.be.revertedWithCustomError(f.stakes, "InvalidSigner")
          .withArgs(f.alice.address, f.mallory.address);
        await expect(call(await withdrawSig(f, f.alice, { chainIdDelta: 1n })))
          .to.be.revertedWithCustomError(f.stakes, "InvalidSigner");
        const late = await withdrawSig(f, f.alice, { deadline: (await time.latest()) + 3n });
        await time.setNextBlockTimestamp(late.deadline + 1n);
        await expect(call(late)).to.be.revertedWithCustomError(f.stakes, "SignatureExpired");
        const good = await withdrawSig(f, f.alice);
        await expect(call(good)).to.changeTokenBalances(f.token, [f.alice, f.relayer], [40n * E18, 0n]);
        await expect(call(good)).to.be.revertedWithCustomError(f.stakes, "InvalidNonce").withArgs(f.alice.address, 1n, 0n);
        const again = await withdrawSig(f, f.alice);
        await expect(call(again)).to.be.revertedWithCustomError(f.stakes, "NothingToWithdraw");
      });
  });

  describe("market functions", function () {
    it("are refused to accounts without MARKET_ROLE", async function () {
      const f = await loadFixture(stakedFixture);
      const role = await f.stakes.MARKET_ROLE();
      for (const call of [
        () => f.stakes.connect(f.mallory).lock(f.alice.address, 1n),
        () => f.stakes.connect(f.mallory).unlock(f.alice.address, 1n),
        () => f.stakes.connect(f.mallory).slash(f.alice.address, 1n, f.mallory.address),
      ]) {
        await expect(call()).to.be.revertedWithCustomError(f.stakes, "AccessControlUnauthorizedAccount")
          .withArgs(f.mallory.address, role);
      }
    });

    it("lock takes only free stake; unlock releases and saturates at zero", async function () {
      const f = await loadFixture(stakedFixture);
      await f.stakes.connect(f.market).lock(f.alice.address, 60n * E18);
      await expect(f.stakes.connect(f.market).lock(f.alice.address, 41n * E18))
        .to.be.revertedWithCustomError(f.stakes, "InsufficientFreeStake").withArgs(f.alice.address, 40n * E18, 41n * E18);
      await f.stakes.connect(f.market).unlock(f.alice.address, 10n * E18);
      expect((await f.stakes.stakeOf(f.alice.address))[1]).to.equal(50n * E18);
      await f.stakes.connect(f.market).unlock(f.alice.address, 500n * E18);
      expect((await f.stakes.stakeOf(f.alice.address))[1]).to.equal(0n);
    });

    it("slash takes bonded stake first, then unbonding stake, and sends it to the recipient", async function () {
      const f = await loadFixture(stakedFixture);
      await f.stakes.connect(f.market).lock(f.alice.address, 30n * E18);
      await f.stakes.connect(f.alice).requestUnstake(70n * E18); // bonded 30 (all locked), unbonding 70
      const slash = f.stakes.connect(f.market).slash(f.alice.address, 50n * E18, f.market.address);
      await expect(slash).to.emit(f.stakes, "StakeSlashed").withArgs(f.alice.address, 50n * E18, f.market.address);
      await expect(slash).to.changeTokenBalances(f.token, [f.stakes, f.market], [-50n * E18, 50n * E18]);
      const [bonded, locked, unbonding] = await f.stakes.stakeOf(f.alice.address);
      expect([bonded, locked, unbonding]).to.deep.equal([0n, 0n, 50n * E18]);
      expect(await f.stakes.totalStaked()).to.equal(50n * E18);
      await expectSolvent(f);
    });

    it("slashes unbonding stake requested just before the slash (no escape by unstaking)", async function () {
      const f = await loadFixture(stakedFixture);
      await f.stakes.connect(f.alice).requestUnstake(100n * E18);
      await f.stakes.connect(f.market).slash(f.alice.address, 60n * E18, f.market.address);
      const [, , , thawAt] = await f.stakes.stakeOf(f.alice.address);
      await time.increaseTo(thawAt);
      await expect(f.stakes.connect(f.alice).withdraw()).to.changeTokenBalance(f.token, f.alice, 40n * E18);
    });

    it("never lets slashed stake be withdrawn, and caps a slash at what the account holds", async function () {
      const f = await loadFixture(stakedFixture);
      await f.stakes.connect(f.alice).requestUnstake(100n * E18);
      const slashed = await f.stakes.connect(f.market).slash.staticCall(f.alice.address, 500n * E18, f.market.address);
      expect(slashed).to.equal(100n * E18);
      await f.stakes.connect(f.market).slash(f.alice.address, 500n * E18, f.market.address);
      await time.increase(UNBONDING);
      await expect(f.stakes.connect(f.alice).withdraw())
        .to.be.revertedWithCustomError(f.stakes, "NothingToWithdraw").withArgs(f.alice.address);
      await expect(f.stakes.connect(f.market).slash(f.alice.address, 1n, f.market.address))
        .to.emit(f.stakes, "StakeSlashed").withArgs(f.alice.address, 0n, f.market.address);
      expect(await f.stakes.totalStaked()).to.equal(0n);
    });
  });

  describe("re-entrancy", function () {
    it("refuses a malicious token re-entering withdrawWithSig during the payout", async function () {
      const f = await stakesFixture("ReentrantToken");
      await f.stakes.connect(f.alice).stake(100n);
      await f.stakes.connect(f.alice).requestUnstake(100n);
      await time.increase(UNBONDING);
      // The token re-enters with a valid signed withdrawal for the same staker (next nonce).
      const s = await withdrawSig(f, f.alice);
      const reentry = f.stakes.interface.encodeFunctionData("withdrawWithSig",
        [f.alice.address, s.nonce, s.deadline, s.signature]);
      await f.token.setHook(await f.stakes.getAddress(), reentry);
      await expect(f.stakes.connect(f.alice).withdraw()).to.changeTokenBalance(f.token, f.alice, 100n);
      expect(await f.token.hookCalls()).to.equal(1n);
      expect(await f.token.lastHookSucceeded()).to.equal(false);
      expect(await f.token.lastHookReturn())
        .to.equal(f.stakes.interface.getError("ReentrancyGuardReentrantCall").selector);
      expect(await f.stakes.totalStaked()).to.equal(0n);
      await expectSolvent(f);
    });
  });
});
