// Throwaway gas-study harness for the round-batched settlement prototypes (RoundMarketA / RoundMarketB).
const hre = require("hardhat");
const { ethers, network } = hre;

const TOKEN = 10n ** 18n;
const PRICE = 10n * TOKEN;
const FEE = 3n * TOKEN;
const COLLATERAL = 5n * TOKEN;
const FAR = 4_102_444_800n;
const SHARDS = 8;
const WINDOW = 3600n;
const RING = 64;

const TYPES = {
  RoundWork: [
    { name: "orderId", type: "uint256" },
    { name: "round", type: "uint256" },
    { name: "unit", type: "uint256" },
    { name: "provider", type: "address" },
    { name: "commitment", type: "bytes32" },
    { name: "price", type: "uint256" },
    { name: "deadline", type: "uint256" },
  ],
};

const coder = ethers.AbiCoder.defaultAbiCoder();
let label = 0;
function fresh() {
  label += 1;
  return ethers.keccak256(ethers.toUtf8Bytes(`roundstudy ${label}`));
}

function floorOf(data) {
  const bytes = ethers.getBytes(data);
  let zeros = 0;
  for (const b of bytes) if (b === 0) zeros += 1;
  const tokens = zeros + 4 * (bytes.length - zeros);
  return { floor: 21000 + 10 * tokens, standardCalldata: 4 * tokens, bytes: bytes.length };
}

class Ctx {
  constructor(design, k, distinct, opts = {}) {
    this.design = design; // "A2" | "A2C" | "A1" | "B"
    this.k = k;
    this.distinct = distinct;
    this.checkStake = opts.checkStake !== false;
    this.badLeaf = null;
  }

  async deploy() {
    const [deployer, buyer] = await ethers.getSigners();
    this.operator = deployer;
    this.buyer = buyer;
    const nProv = this.distinct ? SHARDS * this.k : this.k;
    this.providers = [];
    for (let i = 0; i < nProv; i++) {
      const w = new ethers.Wallet(ethers.keccak256(ethers.toUtf8Bytes(`provider ${this.k} ${i}`)), ethers.provider);
      await network.provider.send("hardhat_setBalance", [w.address, "0x56BC75E2D63100000"]);
      this.providers.push(w);
    }
    this.token = await (await ethers.getContractFactory("RoundToken")).deploy();
    this.stake = await (await ethers.getContractFactory("RoundStake")).deploy(this.token.target, 7 * 24 * 3600);
    if (this.design === "B") {
      this.market = await (await ethers.getContractFactory("RoundMarketB")).deploy(
        this.token.target, this.stake.target, deployer.address, COLLATERAL, 0, 0, this.checkStake,
        RING, WINDOW, 100n * TOKEN, 50n * TOKEN);
    } else if (this.design === "A1R") {
      this.market = await (await ethers.getContractFactory("RoundMarketAR")).deploy(
        this.token.target, this.stake.target, deployer.address, COLLATERAL, 0, 0, this.checkStake);
    } else {
      this.market = await (await ethers.getContractFactory("RoundMarketA")).deploy(
        this.token.target, this.stake.target, deployer.address, COLLATERAL, 0, 0, this.checkStake);
    }
    await this.stake.addMarket(this.market.target);
    this.domain = {
      name: { B: "Veritrain RoundMarketB", A1R: "Veritrain RoundMarketAR" }[this.design] || "Veritrain RoundMarketA",
      version: "1",
      chainId: 31337,
      verifyingContract: this.market.target,
    };
    await this.token.mint(buyer.address, 10n ** 9n * TOKEN);
    await this.token.connect(buyer).approve(this.market.target, ethers.MaxUint256);
    for (const p of this.providers) {
      await this.token.mint(p.address, 1000n * TOKEN);
      await this.token.connect(p).approve(this.stake.target, ethers.MaxUint256);
      await this.stake.connect(p).stake(1000n * TOKEN);
    }
    if (this.design === "B") {
      await this.token.mint(deployer.address, 1000n * TOKEN);
      await this.token.approve(this.market.target, ethers.MaxUint256);
      await this.market.bond(100n * TOKEN);
    }
  }

  /** Provider wallet of replica r of unit u. */
  providerOf(u, r) {
    if (!this.distinct) return this.providers[r];
    if (u < SHARDS) return this.providers[u * this.k + r];
    return this.providers[r]; // the aggregate unit: the first k providers again
  }

  /** A round's data: sorted provider list, replicas unit by unit with commitment and signature. */
  buildRound(orderId, round) {
    const ws = [];
    for (let u = 0; u <= SHARDS; u++) for (let r = 0; r < this.k; r++) ws.push(this.providerOf(u, r));
    const addrs = [...new Set(ws.map((w) => w.address))].sort((a, b) => (BigInt(a) < BigInt(b) ? -1 : 1));
    const index = new Map(addrs.map((a, i) => [a, i]));
    const reps = [];
    for (let u = 0; u <= SHARDS; u++) {
      const digest = fresh();
      const unitKey = (BigInt(orderId) << 64n) | (BigInt(round) << 16n) | BigInt(u);
      for (let r = 0; r < this.k; r++) {
        const w = this.providerOf(u, r);
        const salt = fresh();
        const commitment = ethers.keccak256(
          coder.encode(["bytes32", "bytes32", "address", "uint256"], [digest, salt, w.address, unitKey]));
        const value = { orderId, round, unit: u, provider: w.address, commitment, price: PRICE, deadline: FAR };
        let signer = w;
        if (this.badLeaf && this.badLeaf.round === round && this.badLeaf.leaf === reps.length) {
          signer = this.providers[(this.providers.indexOf(w) + 1) % this.providers.length];
        }
        const sig = signer.signingKey.sign(ethers.TypedDataEncoder.hash(this.domain, TYPES, value));
        reps.push({ u, p: index.get(w.address), provider: w.address, digest, salt, commitment, r: sig.r, vs: sig.yParityAndS });
      }
    }
    const sigs = reps.flatMap((x) => [x.r, x.vs]);
    const aux = ethers.keccak256(coder.encode(["bytes32", "uint256"],
      [ethers.keccak256(ethers.concat(sigs)), FAR]));
    let layout = 0n;
    reps.forEach((x, i) => { layout |= BigInt(x.p) << BigInt(5 * i); });
    return { providers: addrs, reps, sigs, aux, round, layout };
  }

  entries(rd) { return rd.reps.map((x) => [x.p, x.commitment, x.r, x.vs]); }
  leaves(rd) { return rd.reps.map((x) => [x.p, x.commitment]); }
  openings(rd) { return rd.reps.map((x) => [x.p, x.digest, x.salt]); }
  rSigs(rd) { return rd.reps.map((x) => [x.commitment, x.r, x.vs]); }
  rOps(rd) { return rd.reps.map((x) => [x.digest, x.salt]); }
  openingsC(rd) { return rd.reps.map((x) => [x.p, x.commitment, x.digest, x.salt]); }

  async send(log, name, txPromise) {
    const tx = await txPromise;
    const rc = await tx.wait();
    const f = floorOf(tx.data);
    log.push({ name, gas: Number(rc.gasUsed), floorBound: Number(rc.gasUsed) === f.floor, bytes: f.bytes, floor: f.floor });
    return rc;
  }

  /** One whole order of `rounds` rounds; returns every transaction's gas. */
  async runOrder(rounds) {
    const log = [];
    const m = this.market;
    const op = m.connect(this.operator);
    const orderId = Number(await m.orderCount()) + 1;
    const now = BigInt((await ethers.provider.getBlock("latest")).timestamp);
    const orderDeadline = this.design === "A1R" ? now + 6n * 24n * 3600n : FAR;
    await this.send(log, "postOrder", m.connect(this.buyer).postOrder(fresh(), rounds, SHARDS, this.k, PRICE, FEE, orderDeadline));
    let prev = null;
    for (let r = 0; r < rounds; r++) {
      const rd = this.buildRound(orderId, r);
      if (this.design === "A2" || this.design === "A2C") {
        await this.send(log, "commitRound", op.commitRound(orderId, r, FAR, rd.providers, this.entries(rd)));
        if (this.design === "A2") {
          await this.send(log, "revealRound", m.revealRound(orderId, r, rd.providers, this.openings(rd)));
        } else {
          await this.send(log, "revealRoundWithCommitments",
            m.revealRoundWithCommitments(orderId, r, rd.providers, this.openingsC(rd)));
        }
      } else if (this.design === "A1R") {
        await this.send(log, r === 0 ? "stepRound(first)" : "stepRound", op.stepRound(orderId, r,
          prev ? this.rOps(prev) : [], FAR, rd.providers, rd.layout, this.rSigs(rd)));
      } else if (this.design === "A1") {
        await this.send(log, r === 0 ? "stepRound(first)" : "stepRound", op.stepRound(orderId, r,
          prev ? prev.providers : [], prev ? this.openings(prev) : [], FAR, rd.providers, this.entries(rd)));
      } else {
        await this.send(log, r === 0 ? "postRound(first)" : "postRound", op.postRound(orderId, r,
          prev ? prev.providers : [], prev ? this.openings(prev) : [], prev ? prev.aux : ethers.ZeroHash,
          FAR, rd.providers, this.leaves(rd), rd.sigs));
      }
      prev = rd;
    }
    if (this.design === "A1") {
      await this.send(log, "revealRound(last)", m.revealRound(orderId, rounds - 1, prev.providers, this.openings(prev)));
    } else if (this.design === "A1R") {
      await this.send(log, "revealRound(last)", m.revealLast(orderId, rounds - 1, prev.providers, prev.layout, this.rOps(prev)));
    } else if (this.design === "B") {
      await this.send(log, "revealLast", m.revealLast(orderId, rounds - 1, prev.providers, this.openings(prev), prev.aux));
    }
    this.lastRound = prev;
    if (this.design === "A1R") {
      await this.send(log, "closeOrder", m.connect(this.buyer).closeRoster(orderId, prev.providers, prev.layout));
    } else {
      await this.send(log, "closeOrder", m.connect(this.buyer).closeOrder(orderId));
    }
    if (this.design === "B") {
      await network.provider.send("evm_increaseTime", [Number(3n * WINDOW)]);
      await network.provider.send("evm_mine", []);
    }
    await this.send(log, "withdraw(buyer)", m.connect(this.buyer).withdraw());
    const expected = new Map();
    for (let r = 0; r < rounds; r++) for (let u = 0; u <= SHARDS; u++) for (let i = 0; i < this.k; i++) {
      const a = this.providerOf(u, i).address;
      expected.set(a, (expected.get(a) || 0n) + PRICE);
    }
    for (const p of this.providers) {
      const before = await this.token.balanceOf(p.address);
      await this.send(log, "withdraw(provider)", m.connect(p).withdraw());
      const got = (await this.token.balanceOf(p.address)) - before;
      if (got !== expected.get(p.address)) throw new Error(`provider ${p.address} withdrew ${got}, expected ${expected.get(p.address)}`);
    }
    const t = await m.totals();
    const bal = await this.token.balanceOf(m.target);
    if (bal < t.escrow + t.credits) throw new Error("solvency broken");
    return summarize(log, rounds, this.k);
  }
}

const PER_ORDER = new Set(["postOrder", "closeOrder", "withdraw(buyer)", "withdraw(provider)"]);

function summarize(log, rounds, k) {
  const shardUnits = rounds * SHARDS;
  const total = log.reduce((s, x) => s + x.gas, 0);
  const perOrder = log.filter((x) => PER_ORDER.has(x.name)).reduce((s, x) => s + x.gas, 0);
  const roundTx = log.filter((x) => !PER_ORDER.has(x.name));
  const roundGas = roundTx.reduce((s, x) => s + x.gas, 0);
  const byName = {};
  for (const x of log) {
    const e = (byName[x.name] ||= { count: 0, gas: 0, floorBound: 0, bytes: 0, floor: 0 });
    e.count += 1; e.gas += x.gas; e.floorBound += x.floorBound ? 1 : 0; e.bytes += x.bytes; e.floor += x.floor;
  }
  for (const e of Object.values(byName)) { e.mean = Math.round(e.gas / e.count); e.meanBytes = Math.round(e.bytes / e.count); e.meanFloor = Math.round(e.floor / e.count); }
  return {
    rounds, k, shardUnits, total, perOrder, roundGas,
    perShardUnit: Math.round(total / shardUnits),
    roundPartPerShardUnit: Math.round(roundGas / shardUnits),
    orderPartPerShardUnit: Math.round(perOrder / shardUnits),
    perRound: Math.round(roundGas / rounds),
    txCount: log.length,
    floorBoundTx: log.filter((x) => x.floorBound).length,
    byName,
  };
}

/** Deploys, brings the contract to steady state, measures orders of each R. */
async function study(design, k, distinct, Rs, opts = {}) {
  await network.provider.send("hardhat_reset", []);
  const ctx = new Ctx(design, k, distinct, opts);
  await ctx.deploy();
  // background order kept open (non-zero escrow total), then a warm-up order by the same parties
  await ctx.market.connect(ctx.buyer).postOrder(fresh(), 1, SHARDS, k, PRICE, FEE, FAR);
  await ctx.runOrder(design === "B" ? RING : 2);
  const out = [];
  for (const R of Rs) out.push(await ctx.runOrder(R));
  return { design, k, distinct, checkStake: ctx.checkStake, hardfork: network.config.hardfork, results: out, ctx };
}

function fmt(res) {
  const who = res.distinct ? `${res.k === 3 ? 24 : 8} distinct` : `${res.k} reused`;
  const rows = res.results.map((r) =>
    `  R=${String(r.rounds).padStart(2)}: ${String(r.perShardUnit).padStart(7)} /shard unit ` +
    `(rounds ${r.roundPartPerShardUnit} + order ${r.orderPartPerShardUnit}); per round ${r.perRound}; ` +
    `per order ${r.perOrder}; tx ${r.txCount}, floor-bound ${r.floorBoundTx}\n    ` +
    Object.entries(r.byName).map(([n, e]) => `${n} x${e.count} mean ${e.mean}${e.floorBound ? ` [floor ${e.floorBound}]` : ""} (${e.meanBytes} B)`).join("; "));
  return `${res.design} k=${res.k} ${who}${res.checkStake ? "" : " (no stake check)"} [${res.hardfork}]\n${rows.join("\n")}`;
}

module.exports = { study, fmt, Ctx, SHARDS, fresh, WINDOW, RING, TOKEN, FAR, PRICE };
