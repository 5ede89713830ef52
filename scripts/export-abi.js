#!/usr/bin/env node
// Copy the compiled ABI and bytecode of the Veritrain contracts into the Python package
// (veritrain/contracts_data/<Name>.json), so Python needs no Solidity compiler.
//
// Usage: node_modules/.bin/hardhat compile --force && node scripts/export-abi.js
// --force: an incremental compile (only the changed files) can give different bytecode from a fresh
// one with viaIR (measured: JobMarket 24,112 vs 24,237 bytes), and tests/chain/test_compiled_data.py
// compares the export with a fresh compile; a stale incremental export failed CI once.
// Output per contract: {"contractName", "abi", "bytecode", "deployedBytecode", "solcVersion",
// "sourceSha256"} with a stable key order and a trailing newline, so re-running it on unchanged
// sources changes no byte. sourceSha256 is the sha256 of the contract's source file as compiled.
"use strict";

const crypto = require("crypto");
const fs = require("fs");
const path = require("path");

const ROOT = path.resolve(__dirname, "..");
// contract name -> the source file (contracts/<file>.sol) that defines it
const CONTRACTS = {
  VeriToken: "VeriToken",
  StakeManager: "StakeManager",
  JobMarket: "JobMarket",
  JobMarketExtension: "JobMarket",
  JobMarketRoundsExtension: "JobMarket",
  AdminTimelock: "AdminTimelock",
  VerdictAppeals: "VerdictAppeals",
};
const OUT_DIR = path.join(ROOT, "veritrain", "contracts_data");

function fail(message) {
  process.stderr.write(`export-abi: ${message}\n`);
  process.exit(2);
}

function readJson(file) {
  if (!fs.existsSync(file)) fail(`missing ${path.relative(ROOT, file)}; run \`hardhat compile\` first`);
  return JSON.parse(fs.readFileSync(file, "utf8"));
}

function exportContract([name, file]) {
  const artifactDir = path.join(ROOT, "artifacts", "contracts", `${file}.sol`);
  const artifact = readJson(path.join(artifactDir, `${name}.json`));
  const debug = readJson(path.join(artifactDir, `${name}.dbg.json`));
  const buildInfo = readJson(path.resolve(artifactDir, debug.buildInfo));
  const sourceName = `contracts/${file}.sol`;
  const compiledSource = buildInfo.input.sources[sourceName];
  if (!compiledSource) fail(`${sourceName} is not in its build info`);
  const onDisk = fs.readFileSync(path.join(ROOT, sourceName), "utf8");
  if (onDisk !== compiledSource.content) fail(`${sourceName} changed since the last compile; recompile`);
  const data = {
    contractName: artifact.contractName,
    abi: artifact.abi,
    bytecode: artifact.bytecode,
    deployedBytecode: artifact.deployedBytecode,
    solcVersion: buildInfo.solcLongVersion,
    sourceSha256: crypto.createHash("sha256").update(compiledSource.content, "utf8").digest("hex"),
  };
  const outFile = path.join(OUT_DIR, `${name}.json`);
  fs.writeFileSync(outFile, `${JSON.stringify(data, null, 2)}\n`);
  process.stdout.write(`wrote ${path.relative(ROOT, outFile)}\n`);
}

fs.mkdirSync(OUT_DIR, { recursive: true });
Object.entries(CONTRACTS).forEach(exportContract);
