"use strict";

const { expect } = require("chai");
const { ethers } = require("hardhat");
const { loadFixture, time } = require("./chain");

async function tokenFixture() {
  const [owner, alice, bob] = await ethers.getSigners();
  const token = await ethers.deployContract("VeriToken");
  return { token, owner, alice, bob };
}

describe("VeriToken", function () {
  it("is the Veritrain Token (VERI, 18 decimals) owned by its deployer", async function () {
    const { token, owner } = await loadFixture(tokenFixture);
    expect(await token.name()).to.equal("Veritrain Token");
    expect(await token.symbol()).to.equal("VERI");
    expect(await token.decimals()).to.equal(18n);
    expect(await token.owner()).to.equal(owner.address);
  });

  it("lets the owner mint", async function () {
    const { token, alice } = await loadFixture(tokenFixture);
    await expect(token.mint(alice.address, 5n)).to.changeTokenBalance(token, alice, 5n);
    expect(await token.totalSupply()).to.equal(5n);
  });

  it("refuses minting by anyone else", async function () {
    const { token, alice } = await loadFixture(tokenFixture);
    await expect(token.connect(alice).mint(alice.address, 5n))
      .to.be.revertedWithCustomError(token, "OwnableUnauthorizedAccount").withArgs(alice.address);
  });

  it("accepts an ERC-2612 permit relayed by someone else", async function () {
    const { token, alice, bob } = await loadFixture(tokenFixture);
    const deadline = (await time.latest()) + 100n;
    const { chainId } = await ethers.provider.getNetwork();
    const sig = ethers.Signature.from(await alice.signTypedData(
      { name: "Veritrain Token", version: "1", chainId, verifyingContract: await token.getAddress() },
      { Permit: [
        { name: "owner", type: "address" }, { name: "spender", type: "address" }, { name: "value", type: "uint256" },
        { name: "nonce", type: "uint256" }, { name: "deadline", type: "uint256" }] },
      { owner: alice.address, spender: bob.address, value: 7n, nonce: 0n, deadline },
    ));
    await token.connect(bob).permit(alice.address, bob.address, 7n, deadline, sig.v, sig.r, sig.s);
    expect(await token.allowance(alice.address, bob.address)).to.equal(7n);
  });
});
