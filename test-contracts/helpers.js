// Shared fixture and EIP-712 helpers for the Veritrain contract tests.
"use strict";

const { ethers, network } = require("hardhat");
const { time } = require("./chain");

const E18 = 10n ** 18n;
const PARAMS = {
  commitWindow: 600n,
  revealWindow: 600n,
  verdictWindow: 900n,
  minVerifiers: 2,
  bountyBps: 5000,
  providerCollateral: 100n * E18,
  slashAmount: 60n * E18,
  verifierCollateral: 10n * E18,
  spotCheckPpm: 0, // no random draws in the fixture: tests that need one set a rate
  soloSpotCheckPpm: 0,
  withholdPenalty: 20n * E18,
  probationStreak: 0, // no unit drawn for a newcomer: tests of probation set a streak
};
const UNBONDING = 7n * 24n * 3600n;
const PRICE = 5n * E18;
const FEE = 3n * E18;
const ACCEPT = 0;
const FAULT = 1;
const FRAUD = 2;
const UNIT_STATE = { None: 0n, Committing: 1n, Revealing: 2n, Finalized: 3n, Verdicted: 4n, Expired: 5n };

const TYPES = {
  Accept: [
    { name: "orderId", type: "uint256" },
    { name: "unitKey", type: "bytes32" },
    { name: "provider", type: "address" },
    { name: "nonce", type: "uint256" },
    { name: "deadline", type: "uint256" },
  ],
  Commit: [
    { name: "unitId", type: "uint256" },
    { name: "provider", type: "address" },
    { name: "commitment", type: "bytes32" },
    { name: "nonce", type: "uint256" },
    { name: "deadline", type: "uint256" },
  ],
  UnitCommit: [
    { name: "unitId", type: "uint256" },
    { name: "provider", type: "address" },
    { name: "commitment", type: "bytes32" },
    { name: "deadline", type: "uint256" },
  ],
  RoundCommit: [
    { name: "orderId", type: "uint256" },
    { name: "round", type: "uint256" },
    { name: "provider", type: "address" },
    { name: "commitmentsHash", type: "bytes32" },
    { name: "deadline", type: "uint256" },
  ],
  Verdict: [
    { name: "unitId", type: "uint256" },
    { name: "outcomesHash", type: "bytes32" },
    { name: "deadline", type: "uint256" },
  ],
  RoundAudit: [
    { name: "orderId", type: "uint256" },
    { name: "records", type: "bytes32" },
  ],
  WithdrawCredit: [
    { name: "account", type: "address" },
    { name: "nonce", type: "uint256" },
    { name: "deadline", type: "uint256" },
  ],
  RequestUnstake: [
    { name: "staker", type: "address" },
    { name: "amount", type: "uint256" },
    { name: "nonce", type: "uint256" },
    { name: "deadline", type: "uint256" },
  ],
  Withdraw: [
    { name: "staker", type: "address" },
    { name: "nonce", type: "uint256" },
    { name: "deadline", type: "uint256" },
  ],
};

async function domainOf(contract, name, chainIdDelta = 0n) {
  const { chainId } = await ethers.provider.getNetwork();
  return { name, version: "1", chainId: chainId + chainIdDelta, verifyingContract: await contract.getAddress() };
}

/** Signs one typed message; `opts.chainIdDelta` signs for another chain, `opts.contract` for another contract. */
async function signTyped(signer, contract, domainName, typeName, value, opts = {}) {
  const domain = await domainOf(opts.contract ?? contract, domainName, opts.chainIdDelta ?? 0n);
  return signer.signTypedData(domain, { [typeName]: TYPES[typeName] }, value);
}

const signMarket = (signer, market, typeName, value, opts) =>
  signTyped(signer, market, "Veritrain JobMarket", typeName, value, opts);
const signStakes = (signer, stakes, typeName, value, opts) =>
  signTyped(signer, stakes, "Veritrain StakeManager", typeName, value, opts);

async function farDeadline() {
  return BigInt(await time.latest()) + 3600n;
}

/** Unordered Accept nonces: each signer draws the next unused value (any order is valid on chain). */
const acceptNonces = new Map();
function nextAcceptNonce(address) {
  const nonce = acceptNonces.get(address) ?? 0n;
  acceptNonces.set(address, nonce + 1n);
  return nonce;
}

async function signAccept(market, provider, orderId, unitKey, opts = {}) {
  const nonce = opts.nonce ?? nextAcceptNonce(provider.address);
  const deadline = opts.deadline ?? (await farDeadline());
  const signature = await signMarket(opts.signer ?? provider, market, "Accept",
    { orderId, unitKey, provider: provider.address, nonce, deadline }, opts);
  return { nonce, deadline, signature };
}

// keccak256(abi.encodePacked(uint8[])): packed arrays still pad each element to a 32-byte word.
const outcomesHashOf = (outcomes) => ethers.keccak256(ethers.concat(outcomes.map((o) => ethers.toBeHex(o, 32))));

/** An outcome-only, nonce-free `Verdict` signature (a `VerifierSignature`). */
async function signVerdict(market, verifier, unitId, outcomes, opts = {}) {
  const deadline = opts.deadline ?? (await farDeadline());
  const signature = await signMarket(opts.signer ?? verifier, market, "Verdict",
    { unitId, outcomesHash: outcomesHashOf(outcomes), deadline }, opts);
  return { verifier: verifier.address, deadline, signature };
}

/** A `SignedCommit` for {commitBatch}: an EIP-712 `UnitCommit` (no nonce) over `commitment`. */
async function signUnitCommit(market, provider, unitId, commitment, opts = {}) {
  const deadline = opts.deadline ?? (await farDeadline());
  const signature = await signMarket(opts.signer ?? provider, market, "UnitCommit",
    { unitId, provider: provider.address, commitment, deadline }, opts);
  return { provider: provider.address, commitment, deadline, signature };
}

function commitmentOf(digest, salt, provider, unitId) {
  return ethers.keccak256(
    ethers.AbiCoder.defaultAbiCoder().encode(["bytes32", "bytes32", "address", "uint256"], [digest, salt, provider, unitId]),
  );
}

const digestOf = (label) => ethers.id(`digest:${label}`);
const saltOf = (label) => ethers.id(`salt:${label}`);

/** Deploys a JobMarketExtension and a JobMarketRoundsExtension with `token`, `stakes` and `params`, then the
 * JobMarket that runs them (`extension`, `roundsExtension`: others to pass instead). */
async function deployMarket(token, stakes, operator, params, extension = undefined, roundsExtension = undefined) {
  const ext = extension ?? await ethers.deployContract("JobMarketExtension", [token, stakes, params]);
  const rounds = roundsExtension ?? await ethers.deployContract("JobMarketRoundsExtension", [token, stakes, params]);
  return ethers.deployContract("JobMarket", [token, stakes, operator, params, await ext.getAddress(), await rounds.getAddress()]);
}

/** Deploys token, stake manager and market (with `tokenFactoryName` as the token, VeriToken by default). */
async function deploySystem(tokenFactoryName = "VeriToken", params = PARAMS) {
  const [admin, operator, buyer, p1, p2, p3, p4, v1, v2, v3, other] = await ethers.getSigners();
  const token = await ethers.deployContract(tokenFactoryName);
  const stakes = await ethers.deployContract("StakeManager", [await token.getAddress(), UNBONDING, admin.address]);
  const market = await deployMarket(await token.getAddress(), await stakes.getAddress(), operator.address, params);
  await stakes.grantRole(await stakes.MARKET_ROLE(), await market.getAddress());
  return { token, stakes, market, admin, operator, buyer, providers: [p1, p2, p3, p4], verifiers: [v1, v2, v3], other };
}

/** VerdictAppeals parameters of the tests that deploy it. */
const APPEAL_PARAMS = {
  appealWindow: 3600n,
  voteWindow: 7200n,
  panelSize: 3,
  bountyBps: 5000,
  appealBond: 10n * E18,
  refereeStake: 10n * E18,
  verifierSlash: 20n * E18,
};

/** Deploys VerdictAppeals on `sys.market` with the roles a deployment grants it: the stake manager's
 * MARKET_ROLE (it slashes) and the market's APPEALS_ROLE (it settles held fraud). */
async function deployAppeals(sys, params = APPEAL_PARAMS) {
  const appeals = await ethers.deployContract("VerdictAppeals", [await sys.market.getAddress(), params]);
  await sys.stakes.grantRole(await sys.stakes.MARKET_ROLE(), await appeals.getAddress());
  await sys.market.connect(sys.admin).grantRole(await sys.market.APPEALS_ROLE(), await appeals.getAddress());
  return appeals;
}

/** The full system with funded, approved and staked parties. */
async function systemFixture() {
  return fundedSystem(PARAMS);
}

/** {systemFixture} with other market parameters (and another token: a test mock with `mint`). */
async function fundedSystem(params, tokenFactoryName = "VeriToken") {
  const sys = await deploySystem(tokenFactoryName, params);
  const { token, stakes, market, buyer, providers, verifiers } = sys;
  const stakesAddr = await stakes.getAddress();
  const marketAddr = await market.getAddress();
  await token.mint(buyer.address, 10_000n * E18);
  await token.connect(buyer).approve(marketAddr, ethers.MaxUint256);
  for (const party of [...providers, ...verifiers]) {
    await token.mint(party.address, 1_000n * E18);
    await token.connect(party).approve(stakesAddr, ethers.MaxUint256);
    await stakes.connect(party).stake(200n * E18);
  }
  return sys;
}

async function postOrder(sys, opts = {}) {
  const units = opts.units ?? 2;
  const replicas = opts.replicas ?? 3;
  const deadline = opts.deadline ?? BigInt(await time.latest()) + 30n * 24n * 3600n;
  const tx = await sys.market.connect(sys.buyer).postOrder(ethers.id("spec"), units, replicas, PRICE, FEE, deadline);
  const receipt = await tx.wait();
  const orderId = receipt.logs.map((l) => sys.market.interface.parseLog(l)).find((e) => e && e.name === "OrderPosted")
    .args.orderId;
  return { orderId, tx, receipt, deadline };
}

async function assignUnit(sys, orderId, opts = {}) {
  const providers = opts.providers ?? sys.providers.slice(0, 3);
  const verifiers = opts.verifiers ?? sys.verifiers;
  const unitKey = opts.unitKey ?? ethers.id(`unit:${orderId}:${await sys.market.unitCount()}`);
  const accepts = [];
  for (const p of providers) accepts.push(await signAccept(sys.market, p, orderId, unitKey));
  const tx = await sys.market.connect(sys.operator).assign(
    orderId, unitKey, providers.map((p) => p.address), verifiers.map((v) => v.address), accepts);
  const receipt = await tx.wait();
  const unitId = receipt.logs.map((l) => sys.market.interface.parseLog(l)).find((e) => e && e.name === "UnitAssigned")
    .args.unitId;
  return { unitId, tx, receipt, providers, verifiers, unitKey };
}

/** Commits (directly by each provider) `digests[i]` for provider i. */
async function commitAll(sys, unitId, providers, digests) {
  for (let i = 0; i < providers.length; i++) {
    const c = commitmentOf(digests[i], saltOf(`${unitId}:${i}`), providers[i].address, unitId);
    await sys.market.connect(providers[i]).commit(unitId, c);
  }
}

async function revealAll(sys, unitId, providers, digests) {
  for (let i = 0; i < providers.length; i++) {
    await sys.market.connect(sys.other).reveal(unitId, providers[i].address, digests[i], saltOf(`${unitId}:${i}`));
  }
}

/** Posts an order and brings one unit to the given stage: "assigned", "committed" or "revealed". */
async function unitAt(sys, stage, digests = null, opts = {}) {
  const { orderId } = await postOrder(sys, opts);
  const unit = await assignUnit(sys, orderId, opts);
  const ds = digests ?? unit.providers.map(() => digestOf("same"));
  if (stage !== "assigned") await commitAll(sys, unit.unitId, unit.providers, ds);
  if (stage === "revealed") await revealAll(sys, unit.unitId, unit.providers, ds);
  return { orderId, ...unit, digests: ds };
}

module.exports = {
  E18, PARAMS, UNBONDING, PRICE, FEE, ACCEPT, FAULT, FRAUD, UNIT_STATE, TYPES,
  signMarket, signStakes, signAccept, signVerdict, outcomesHashOf, signUnitCommit, commitmentOf, digestOf, saltOf, farDeadline,
  deployMarket, deploySystem, systemFixture, fundedSystem, postOrder, assignUnit, commitAll, revealAll, unitAt,
  APPEAL_PARAMS, deployAppeals,
};

/** Solvency, exactly (these tests never donate tokens): each contract holds what it owes. */
async function expectSolvent(sys) {
  const { expect } = require("chai");
  const market = await sys.market.getAddress();
  const owed = (await sys.market.totalEscrow()) + (await sys.market.totalCredits());
  expect(await sys.token.balanceOf(market)).to.equal(owed);
  expect(await sys.token.balanceOf(await sys.stakes.getAddress())).to.equal(await sys.stakes.totalStaked());
}

/** Fixtures at each stage of one 3-replica unit (order of 2 units, 3 verifiers assigned). */
async function orderFixture() {
  const sys = await systemFixture();
  return { sys, ...(await postOrder(sys)) };
}
async function assignedFixture() {
  const sys = await systemFixture();
  return { sys, ...(await unitAt(sys, "assigned")) };
}
/** Every replica committed, and one more block mined so the unit's reveals are open (even in an eth_call). */
async function committedFixture() {
  const sys = await systemFixture();
  const unit = await unitAt(sys, "committed");
  await network.provider.send("evm_mine", []);
  return { sys, ...unit };
}
async function revealedFixture() {
  const sys = await systemFixture();
  return { sys, ...(await unitAt(sys, "revealed")) };
}
async function disputedFixture() {
  const sys = await systemFixture();
  return { sys, ...(await unitAt(sys, "revealed", [digestOf("good"), digestOf("good"), digestOf("bad")])) };
}

module.exports.expectSolvent = expectSolvent;
module.exports.orderFixture = orderFixture;
module.exports.assignedFixture = assignedFixture;
module.exports.committedFixture = committedFixture;
module.exports.revealedFixture = revealedFixture;
module.exports.disputedFixture = disputedFixture;
