// Snapshot fixtures and clock control over Hardhat's JSON-RPC, the same semantics as
// @nomicfoundation/hardhat-network-helpers' loadFixture/time (not among this repo's pinned packages).
"use strict";

const { network } = require("hardhat");

/** Fixtures in the order their snapshots were taken (a revert invalidates every later snapshot). */
let snapshots = [];

/**
 * Runs `fixture` once, snapshots the chain, and on later calls reverts to that snapshot (and takes a
 * fresh one, since a snapshot id is single-use) before returning the first run's result. Reverting to
 * a fixture drops the fixtures snapshotted after it; they simply run again when next loaded.
 */
async function loadFixture(fixture) {
  const index = snapshots.findIndex((s) => s.fixture === fixture);
  if (index >= 0) {
    const saved = snapshots[index];
    const reverted = await network.provider.send("evm_revert", [saved.snapshotId]);
    if (!reverted) throw new Error(`could not revert to the snapshot of fixture ${fixture.name}`);
    saved.snapshotId = await network.provider.send("evm_snapshot", []);
    snapshots = snapshots.slice(0, index + 1);
    return saved.result;
  }
  const result = await fixture();
  snapshots.push({ fixture, result, snapshotId: await network.provider.send("evm_snapshot", []) });
  return result;
}

async function latest() {
  const block = await network.provider.send("eth_getBlockByNumber", ["latest", false]);
  return BigInt(block.timestamp);
}

/** The next transaction's block will have timestamp `timestamp`. */
async function setNextBlockTimestamp(timestamp) {
  await network.provider.send("evm_setNextBlockTimestamp", [Number(timestamp)]);
}

/** Mines an empty block at `timestamp` (so later calls see it as the latest time). */
async function increaseTo(timestamp) {
  await setNextBlockTimestamp(timestamp);
  await network.provider.send("evm_mine", []);
}

async function increase(seconds) {
  await network.provider.send("evm_increaseTime", [Number(seconds)]);
  await network.provider.send("evm_mine", []);
}

module.exports = { loadFixture, time: { latest, setNextBlockTimestamp, increaseTo, increase } };
