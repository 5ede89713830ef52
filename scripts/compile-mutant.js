#!/usr/bin/env node
// Compile the Veritrain contracts with one seeded bug applied, in memory, for mutation testing.
//
// Usage: node scripts/compile-mutant.js <mutant-id | --original>... [--mutants FILE] [--reuse-shipped]
// Prints {"<mutant-id or --original>": {"<ContractName>": {"abi": [...], "bytecode": "0x...",
// "storageLayout": {...}}, ...}, ...} to stdout: one entry per requested variant, compiled in this one
// process (loading the wasm compiler and Hardhat's config once is most of the cost of a small compile).
// The storage layout lets the Python invariant machine read contract state straight from EVM storage.
//
// Only what a patch can change is compiled again: a contract is compiled for a mutant when a file it imports
// (./ imports, transitively) is patched, or its own file inside its own body or a base's (a file with
// several contracts: see patchReaches), and the others are the original's (their code is unchanged; only the
// metadata hash of the sources would differ). viaIR optimisation of JobMarket.sol's three contracts is most
// of the time. VerdictAppeals.sol imports JobMarket.sol and StakeManager.sol (for their types, to call
// them), so a patch of either compiles VerdictAppeals again too, and a patch of VerdictAppeals.sol compiles
// VerdictAppeals alone.
//
// --reuse-shipped: the unmutated contracts (--original, and a mutant's untouched ones) are not compiled to
// bytecode at all: their bytecode is the shipped veritrain/contracts_data/<Name>.json (which
// tests/chain/test_compiled_data.py checks is exactly what a fresh compile of these sources gives), and only
// their ABI and storage layout are compiled from the sources (no code generation: ~2 s instead of ~30 s of
// wasm solc); a shipped ABI that differs from the sources' is refused (stale package data).
//
// The invariant tests read these outputs from a committed cache when it is current (tests/chain/mutant_cache.py,
// keyed by the sources, the settings and this file's text too; scripts/refresh-mutant-cache rewrites it), and
// run this script only for the variants it misses.
//
// Why a separate compile: Hardhat compiles from disk into artifacts/, which other engineers share;
// a mutant must never touch contracts/ or artifacts/. The compiler settings (evmVersion, optimizer,
// viaIR) are read from hardhat.config.js through Hardhat's own config loader, so a mutant differs from
// the real contracts only by its patch.
"use strict";

const fs = require("fs");
const path = require("path");
const solc = require("solc");

process.env.HARDHAT_DISABLE_TELEMETRY_PROMPT = "true";

const ROOT = path.resolve(__dirname, "..");
// contract name -> the source file (contracts/<file>.sol) that defines it
const SOURCES = {
  VeriToken: "VeriToken",
  StakeManager: "StakeManager",
  JobMarket: "JobMarket",
  JobMarketExtension: "JobMarket",
  JobMarketRoundsExtension: "JobMarket",
  VerdictAppeals: "VerdictAppeals",
};
const CONTRACTS = Object.keys(SOURCES);
const ORIGINAL = "--original";
const DEFAULT_MUTANTS = path.join(ROOT, "tests", "chain", "mutants", "mutants.json");
const SHIPPED = path.join(ROOT, "veritrain", "contracts_data");
const USAGE = "usage: compile-mutant.js <mutant-id | --original>... [--mutants FILE] [--reuse-shipped]";

function fail(message) {
  process.stderr.write(`compile-mutant: ${message}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const args = { ids: [], mutantsFile: DEFAULT_MUTANTS, reuseShipped: false };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--mutants") args.mutantsFile = argv[++i];
    else if (argv[i] === "--reuse-shipped") args.reuseShipped = true;
    else args.ids.push(argv[i]);
  }
  if (args.ids.length === 0) fail(USAGE);
  return args;
}

// Every top-level source (shared bases such as TypedSignatures.sol too), so a patch may target any of them.
function readSources() {
  const sources = {};
  for (const file of fs.readdirSync(path.join(ROOT, "contracts")).sort()) {
    if (file.endsWith(".sol")) sources[`contracts/${file}`] = fs.readFileSync(path.join(ROOT, "contracts", file), "utf8");
  }
  return sources;
}

// Each patch replaces an exact text that must occur exactly once, so a drifted source fails loudly
// instead of silently compiling the unmutated contract.
function applyPatches(sources, mutant) {
  for (const patch of mutant.patches) {
    const key = `contracts/${patch.file}`;
    const text = sources[key];
    if (text === undefined) fail(`mutant ${mutant.id}: unknown file ${patch.file}`);
    const first = text.indexOf(patch.find);
    if (first < 0) fail(`mutant ${mutant.id}: text not found in ${patch.file}: ${JSON.stringify(patch.find)}`);
    if (text.indexOf(patch.find, first + 1) >= 0) {
      fail(`mutant ${mutant.id}: text occurs more than once in ${patch.file}: ${JSON.stringify(patch.find)}`);
    }
    sources[key] = text.slice(0, first) + patch.replace + text.slice(first + patch.find.length);
  }
}

function hardhatCompilerSettings() {
  process.chdir(ROOT);
  const hre = require("hardhat");
  const compiler = hre.config.solidity.compilers[0];
  if (compiler.version !== solc.version().split("+")[0]) {
    fail(`hardhat.config.js wants solc ${compiler.version}, node_modules has ${solc.version()}`);
  }
  const { evmVersion, optimizer, viaIR } = compiler.settings;
  return { evmVersion, optimizer, viaIR };
}

function findImport(importPath) {
  const candidates = [path.join(ROOT, "node_modules", importPath), path.join(ROOT, importPath)];
  for (const candidate of candidates) {
    if (fs.existsSync(candidate)) return { contents: fs.readFileSync(candidate, "utf8") };
  }
  return { error: `import not found: ${importPath}` };
}

// `names` (of CONTRACTS) compiled from `sources`; the output selection leaves every other contract out.
// `bytecode` false: ABI and storage layout only (solc stops after analysis), bytecode left out.
function compile(sources, settings, label, names, bytecode = true) {
  const outputs = bytecode ? ["abi", "evm.bytecode.object", "storageLayout"] : ["abi", "storageLayout"];
  const input = {
    language: "Solidity",
    sources: Object.fromEntries(Object.entries(sources).map(([k, v]) => [k, { content: v }])),
    settings: {
      ...settings,
      outputSelection: names.reduce((selection, name) => {
        const file = `contracts/${SOURCES[name]}.sol`;
        selection[file] = { ...selection[file], [name]: outputs };
        return selection;
      }, {}),
    },
  };
  const output = JSON.parse(solc.compile(JSON.stringify(input), { import: findImport }));
  const errors = (output.errors || []).filter((e) => e.severity === "error");
  if (errors.length) fail(`${label}:\n${errors.map((e) => e.formattedMessage).join("\n")}`);
  const result = {};
  for (const name of names) {
    const compiled = output.contracts[`contracts/${SOURCES[name]}.sol`][name];
    result[name] = { abi: compiled.abi, storageLayout: compiled.storageLayout };
    if (bytecode) result[name].bytecode = `0x${compiled.evm.bytecode.object}`;
  }
  return result;
}

// Whether contracts/`file` or a file it imports with "./" (transitively) is in `patched`.
function touchedBy(sources, file, patched, seen = new Set()) {
  if (patched.has(file)) return true;
  if (seen.has(file)) return false;
  seen.add(file);
  const imports = [...sources[`contracts/${file}`].matchAll(/^import\s[^;]*"\.\/([^"]+)";/gm)].map((m) => m[1]);
  return imports.some((imported) => touchedBy(sources, imported, patched, seen));
}

const HEADER = /^(?:abstract\s+)?contract\s+(\w+)(?:\s+is\s+([^{]+))?\{/gm;

// The contracts of one source text in order: name, where its header starts, and its direct bases.
function contractsOf(text) {
  return [...text.matchAll(HEADER)].map((m) => ({
    name: m[1],
    start: m.index,
    bases: m[2] ? m[2].split(",").map((base) => base.trim().match(/^\w+/)[0]) : [],
  }));
}

// Whether a patch of the file that defines `name` can change `name`'s code. A file holding several
// contracts (JobMarket.sol: JobMarket and its two extensions) need not recompile all of them for a patch
// inside one contract's body: only the contracts that are it or inherit it (transitively) run that body.
// A patch before the file's first contract (imports, file-level declarations) changes them all.
function patchReaches(original, mutant, name) {
  const contracts = contractsOf(original);
  const bases = Object.fromEntries(contracts.map((c) => [c.name, c.bases]));
  const closure = new Set();
  const visit = (contract) => {
    if (closure.has(contract)) return;
    closure.add(contract);
    for (const base of bases[contract] || []) visit(base);
  };
  visit(name);
  return mutant.patches.some((patch) => {
    const at = original.indexOf(patch.find);
    const enclosing = contracts.filter((c) => c.start <= at).pop();
    return enclosing === undefined || closure.has(enclosing.name);
  });
}

// The shipped creation bytecode of `name`, refused if the shipped ABI is not the one the sources give.
function shippedBytecode(name, abi) {
  const file = path.join(SHIPPED, `${name}.json`);
  const shipped = JSON.parse(fs.readFileSync(file, "utf8"));
  if (JSON.stringify(shipped.abi) !== JSON.stringify(abi)) {
    fail(`--reuse-shipped: ${file} has another ABI than contracts/ (run scripts/export-abi.js after compiling)`);
  }
  return shipped.bytecode.startsWith("0x") ? shipped.bytecode : `0x${shipped.bytecode}`;
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  const settings = hardhatCompilerSettings();
  const mutants = args.ids.some((id) => id !== ORIGINAL)
    ? JSON.parse(fs.readFileSync(args.mutantsFile, "utf8")).mutants
    : [];
  const original = {}; // contract name -> the unmutated compile, filled on first need
  const originalOf = (names) => {
    const missing = names.filter((name) => !(name in original));
    if (missing.length) {
      const compiled = compile(readSources(), settings, ORIGINAL, missing, !args.reuseShipped);
      if (args.reuseShipped) {
        for (const name of missing) compiled[name].bytecode = shippedBytecode(name, compiled[name].abi);
      }
      Object.assign(original, compiled);
    }
    return Object.fromEntries(names.map((name) => [name, original[name]]));
  };
  const result = {};
  for (const id of args.ids) {
    if (id === ORIGINAL) {
      result[id] = originalOf(CONTRACTS);
      continue;
    }
    const mutant = mutants.find((m) => m.id === id);
    if (!mutant) fail(`no mutant with id ${id} in ${args.mutantsFile}`);
    const sources = readSources();
    applyPatches(sources, mutant);
    const patched = new Set(mutant.patches.map((patch) => patch.file));
    const reaches = (name) => {
      const file = `${SOURCES[name]}.sol`;
      if (!patched.has(file)) return touchedBy(sources, file, patched); // an imported file was patched
      const own = { patches: mutant.patches.filter((patch) => patch.file === file) };
      const others = new Set([...patched].filter((other) => other !== file));
      return patchReaches(readSources()[`contracts/${file}`], own, name) || touchedBy(sources, file, others);
    };
    const changed = CONTRACTS.filter(reaches);
    const kept = CONTRACTS.filter((name) => !changed.includes(name));
    const compiled = { ...originalOf(kept), ...compile(sources, settings, id, changed) };
    result[id] = Object.fromEntries(CONTRACTS.map((name) => [name, compiled[name]]));
  }
  process.stdout.write(JSON.stringify(result));
}

main();
