#!/usr/bin/env node
// Compile the Veritrain contracts with one seeded bug applied, in memory, for mutation testing.
//
// Usage: node scripts/compile-mutant.js <mutant-id | --original>... [--mutants FILE] [--reuse-shipped] [--plan]
// Prints {"<mutant-id or --original>": {"<ContractName>": {"abi": [...], "bytecode": "0x...",
// "storageLayout": {...}}, ...}, ...} to stdout: one entry per requested variant, compiled in this one
// process (loading the wasm compiler and Hardhat's config once is most of the cost of a small compile).
// The storage layout lets the Python invariant machine read contract state straight from EVM storage.
//
// Only what a patch can change is compiled again: a contract is compiled for a mutant when its own file is
// patched inside its own body or a base's (a file with several contracts: see patchReaches), or when a file
// it imports (./ imports, transitively) is patched where it can see the patch (patchVisibleTo), and the
// others are the original's (their code is unchanged; only the metadata hash of the sources would differ).
// viaIR optimisation of JobMarket.sol's three contracts is most of the time. VerdictAppeals.sol imports
// JobMarket.sol and StakeManager.sol (for their types, to call them), and JobMarket.sol imports
// StakeManager.sol: an importer sees of the imported contracts only their declarations (ABI, structs,
// events, errors, constants, signatures), so a patch that changes only the inside of function or modifier
// bodies of contracts the importer neither inherits nor creates (`new`, `type(..)`) leaves its bytecode as
// it was, and it is not compiled again; any other patch of an imported file, or one the check does not
// understand, compiles it again. Every seeded mutant of JobMarket.sol and StakeManager.sol patches a
// function body, so VerdictAppeals is compiled again for the VerdictAppeals.sol mutants alone, and JobMarket
// for none of StakeManager.sol's (VerdictAppeals' bytecode compiled the old way for such mutants was checked
// equal to the original's, metadata hash aside, on 2026-11-29). --plan prints, for each variant, the names
// of the contracts it would compile, and compiles nothing.
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
const USAGE = "usage: compile-mutant.js <mutant-id | --original>... [--mutants FILE] [--reuse-shipped] [--plan]";

function fail(message) {
  process.stderr.write(`compile-mutant: ${message}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const args = { ids: [], mutantsFile: DEFAULT_MUTANTS, reuseShipped: false, plan: false };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--mutants") args.mutantsFile = argv[++i];
    else if (argv[i] === "--reuse-shipped") args.reuseShipped = true;
    else if (argv[i] === "--plan") args.plan = true;
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

// The tokens of a Solidity text (words, single punctuation characters and string literals) with their
// offsets; comments are skipped. Throws on an unterminated comment or string (then nothing is trusted).
function tokens(text) {
  const out = [];
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (/\s/.test(c)) i++;
    else if (text.startsWith("//", i)) i = text.indexOf("\n", i) < 0 ? text.length : text.indexOf("\n", i);
    else if (text.startsWith("/*", i)) {
      const end = text.indexOf("*/", i + 2);
      if (end < 0) throw new Error("unterminated comment");
      i = end + 2;
    } else if (c === '"' || c === "'") {
      let j = i + 1;
      while (j < text.length && text[j] !== c && text[j] !== "\n") j += text[j] === "\\" ? 2 : 1;
      if (text[j] !== c) throw new Error("unterminated string");
      out.push({ kind: "string", value: text.slice(i, j + 1), start: i });
      i = j + 1;
    } else if (/[\w$]/.test(c)) {
      const word = text.slice(i).match(/^[\w$]+/)[0];
      out.push({ kind: "word", value: word, start: i });
      i += word.length;
    } else {
      out.push({ kind: "punct", value: c, start: i });
      i++;
    }
  }
  return out;
}

const BODIED = new Set(["function", "modifier", "constructor", "fallback", "receive"]);

// The contracts, libraries and interfaces of a source text: kind, name, direct bases, and the spans
// [start, end) of the code inside each function's or modifier's braces (braces excluded). Throws where the
// text is not laid out as expected (unbalanced braces, a qualified or aliased base): then nothing is trusted.
function outline(text) {
  const units = [];
  let depth = 0;
  let parens = 0;
  let statement = []; // the tokens since the last `;`, `{` or `}` at depth 0 or 1
  let unit = null; // the contract whose body is open
  let body = null; // the function body being skipped: its start and the depth of its braces
  for (const token of tokens(text)) {
    const v = token.kind === "punct" ? token.value : null;
    if (v === "(") parens++;
    if (v === ")") parens--;
    if (v === "{") {
      depth++;
      if (body || depth > 2) continue;
      const words = statement.filter((t) => t.kind === "word").map((t) => t.value);
      if (depth === 1 && parens === 0) {
        const at = words.findIndex((w) => w === "contract" || w === "library" || w === "interface");
        if (at >= 0) {
          if (words.slice(0, at).some((w) => w !== "abstract")) throw new Error("unexpected contract header");
          const is = statement.findIndex((t) => t.kind === "word" && t.value === "is");
          const bases = [];
          if (is >= 0) {
            let nesting = 0;
            let expectBase = true;
            for (const t of statement.slice(is + 1)) {
              if (t.value === "(") nesting++;
              else if (t.value === ")") nesting--;
              else if (nesting === 0 && t.value === ",") expectBase = true;
              else if (nesting === 0 && expectBase && t.kind === "word") {
                bases.push(t.value);
                expectBase = false;
              } else if (nesting === 0) throw new Error(`unexpected base list: ${t.value}`); // `A.B`, `A<..>`
            }
          }
          unit = { kind: words[at], name: words[at + 1], bases, bodies: [] };
          units.push(unit);
        }
      } else if (depth === 2 && unit && parens === 0 && BODIED.has(words[0])) {
        body = { start: token.start + 1, depth };
      }
      statement = [];
    } else if (v === "}") {
      if (body && depth === body.depth) {
        unit.bodies.push([body.start, token.start]);
        body = null;
      }
      depth--;
      if (depth < 0) throw new Error("unbalanced braces");
      if (depth === 0) unit = null;
      if (!body && depth <= 1) statement = [];
    } else if (!body && depth <= 1) {
      if (v === ";") statement = [];
      else statement.push(token);
    }
  }
  if (depth !== 0 || parens !== 0 || body) throw new Error("unbalanced braces or parentheses");
  return units;
}

// The names that follow `new` or `type(` anywhere in `text`: contracts whose code (creation or runtime) is
// embedded in whichever contract names them.
function embeddedIn(text) {
  const names = new Set();
  const ts = tokens(text);
  ts.forEach((t, i) => {
    if (t.kind === "word" && t.value === "new" && ts[i + 1]?.kind === "word") names.add(ts[i + 1].value);
    if (t.kind === "word" && t.value === "type" && ts[i + 1]?.value === "(" && ts[i + 2]?.kind === "word") {
      names.add(ts[i + 2].value);
    }
  });
  return names;
}

// Whether the patch of contracts/`file` (imported by `name`'s file, directly or not) can change what
// `name` compiles to. It cannot when it changes nothing but the inside of function or modifier bodies of
// contracts whose code `name` does not contain: a contract (not a library: an importer's calls to its
// internal functions are compiled into the importer; nor a free function) that `name` does not inherit,
// directly or not, and that no source names after `new` or `type(` (its code would be embedded). An
// importer sees of the other contracts only their declarations (ABI, types, events, errors, constants,
// modifiers' and functions' signatures), which lie outside those bodies. Checked by comparing the file
// unpatched and patched with those bodies cut out; anything unexpected (the layout not understood, an
// import alias, a duplicate contract name) answers true: compiled again, as before this check.
function patchVisibleTo(originals, sources, file, name) {
  try {
    const texts = [...Object.values(originals), ...Object.values(sources)];
    if (texts.some((text) => /^\s*import\b[^;]*\bas\b/m.test(text))) return true; // names could be aliased
    const bases = {};
    const embedded = new Set();
    for (const key of Object.keys(originals)) {
      const seen = new Set();
      for (const text of [originals[key], sources[key]]) {
        for (const unit of outline(text)) {
          if (!seen.has(unit.name) && unit.name in bases) return true; // two definitions of one name
          seen.add(unit.name);
          bases[unit.name] = [...new Set([...(bases[unit.name] || []), ...unit.bases])];
        }
        for (const embeddedName of embeddedIn(text)) embedded.add(embeddedName);
      }
    }
    const inherited = new Set();
    const visit = (contract) => {
      if (inherited.has(contract)) return;
      inherited.add(contract);
      for (const base of bases[contract] || []) visit(base);
    };
    visit(name);
    const opaque = (unit) => unit.kind === "contract" && !inherited.has(unit.name) && !embedded.has(unit.name);
    const skeleton = (text) => {
      let kept = "";
      let from = 0;
      for (const [start, end] of outline(text).filter(opaque).flatMap((unit) => unit.bodies)) {
        kept += text.slice(from, start);
        from = end;
      }
      return kept + text.slice(from);
    };
    const key = `contracts/${file}`;
    return skeleton(originals[key]) !== skeleton(sources[key]);
  } catch {
    return true;
  }
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
  const settings = args.plan ? null : hardhatCompilerSettings();
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
      result[id] = args.plan ? CONTRACTS : originalOf(CONTRACTS);
      continue;
    }
    const mutant = mutants.find((m) => m.id === id);
    if (!mutant) fail(`no mutant with id ${id} in ${args.mutantsFile}`);
    const sources = readSources();
    applyPatches(sources, mutant);
    const patched = new Set(mutant.patches.map((patch) => patch.file));
    const originals = readSources();
    const reaches = (name) => {
      const file = `${SOURCES[name]}.sol`;
      // the patched files that `name`'s file imports (directly or not) and whose patch `name` can see
      const others = new Set(
        [...patched].filter((other) => other !== file && patchVisibleTo(originals, sources, other, name)),
      );
      if (!patched.has(file)) return touchedBy(sources, file, others);
      const own = { patches: mutant.patches.filter((patch) => patch.file === file) };
      return patchReaches(originals[`contracts/${file}`], own, name) || touchedBy(sources, file, others);
    };
    const changed = CONTRACTS.filter(reaches);
    if (args.plan) {
      result[id] = changed;
      continue;
    }
    const kept = CONTRACTS.filter((name) => !changed.includes(name));
    const compiled = { ...originalOf(kept), ...compile(sources, settings, id, changed) };
    result[id] = Object.fromEntries(CONTRACTS.map((name) => [name, compiled[name]]));
  }
  process.stdout.write(JSON.stringify(result));
}

main();
