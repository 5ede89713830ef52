// Issue 8 finding 10: the deployment hands the admin roles to a timelock, so a role grant is public and
// delayed. An immediate grant by the deployer fails; a scheduled one succeeds only after the delay.
"use strict";

const { expect } = require("chai");
const { ethers } = require("hardhat");
const { time } = require("./chain");

const DELAY = 2n * 24n * 3600n;

describe("AdminTimelock", function () {
  async function deployed() {
    const [deployer, attacker] = await ethers.getSigners();
    const token = await ethers.deployContract("VeriToken");
    const stakes = await ethers.deployContract("StakeManager", [await token.getAddress(), 3600n, deployer.address]);
    const timelock = await ethers.deployContract("AdminTimelock", [DELAY, [deployer.address], [deployer.address]]);
    const admin = await stakes.DEFAULT_ADMIN_ROLE();
    await stakes.grantRole(admin, await timelock.getAddress());
    await stakes.renounceRole(admin, deployer.address);
    return { deployer, attacker, stakes, timelock };
  }

  it("refuses an immediate role grant by the deployer", async function () {
    const { deployer, attacker, stakes } = await deployed();
    await expect(stakes.connect(deployer).grantRole(await stakes.MARKET_ROLE(), attacker.address))
      .to.be.revertedWithCustomError(stakes, "AccessControlUnauthorizedAccount")
      .withArgs(deployer.address, await stakes.DEFAULT_ADMIN_ROLE());
  });

  it("grants a scheduled role only after the delay", async function () {
    const { attacker, stakes, timelock } = await deployed();
    const role = await stakes.MARKET_ROLE();
    const call = stakes.interface.encodeFunctionData("grantRole", [role, attacker.address]);
    const target = await stakes.getAddress();
    const salt = ethers.ZeroHash;
    await expect(timelock.schedule(target, 0, call, ethers.ZeroHash, salt, DELAY - 1n))
      .to.be.revertedWithCustomError(timelock, "TimelockInsufficientDelay");
    await timelock.schedule(target, 0, call, ethers.ZeroHash, salt, DELAY);
    await expect(timelock.execute(target, 0, call, ethers.ZeroHash, salt))
      .to.be.revertedWithCustomError(timelock, "TimelockUnexpectedOperationState");
    await time.increase(DELAY);
    await timelock.execute(target, 0, call, ethers.ZeroHash, salt);
    expect(await stakes.hasRole(role, attacker.address)).to.equal(true);
  });

  it("lets nobody but a proposer schedule", async function () {
    const { attacker, stakes, timelock } = await deployed();
    const call = stakes.interface.encodeFunctionData("grantRole", [await stakes.MARKET_ROLE(), attacker.address]);
    await expect(timelock.connect(attacker).schedule(await stakes.getAddress(), 0, call, ethers.ZeroHash, ethers.ZeroHash, DELAY))
      .to.be.revertedWithCustomError(timelock, "AccessControlUnauthorizedAccount");
  });
});
