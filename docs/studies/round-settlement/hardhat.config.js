// Hardhat 2 with the npm `solc` wasm compiler: this machine (and CI) cannot download solc.
const path = require("path");
const { subtask } = require("hardhat/config");
const { TASK_COMPILE_SOLIDITY_GET_SOLC_BUILD } = require("hardhat/builtin-tasks/task-names");
require("@nomicfoundation/hardhat-chai-matchers");
require("@nomicfoundation/hardhat-ethers");

const SOLC_VERSION = "0.8.28";

subtask(TASK_COMPILE_SOLIDITY_GET_SOLC_BUILD, async (args, hre, runSuper) => {
  if (args.solcVersion !== SOLC_VERSION) return runSuper();
  const solc = require("solc");
  return {
    compilerPath: path.join(path.dirname(require.resolve("solc")), "soljson.js"),
    isSolcJs: true,
    version: SOLC_VERSION,
    longVersion: solc.version(),
  };
});

module.exports = {
  solidity: {
    version: SOLC_VERSION,
    settings: {
      evmVersion: "cancun",
      // runs 500, not 1000: JobMarket with held fraud settlement (settleHeld) is 25.5 kB at 1000 runs,
      // over the 24,576-byte limit; at 500 it is 23.9 kB, for a few hundred gas more per call.
      optimizer: { enabled: true, runs: 500 },
      viaIR: true,
    },
  },
  paths: { sources: "./contracts", tests: "./test-contracts" },
  // allowBlocksWithSameTimestamp: automining gives each block a new second otherwise, so a burst of
  // transactions pushed `hardhat node` time minutes ahead of the wall clock that the market and agents set
  // their deadlines by (found by `veritrain bench chaos`: Accept signatures expired before the assign was sent).
  networks: { hardhat: { chainId: 31337, allowBlocksWithSameTimestamp: true, hardfork: process.env.HF || "prague", allowUnlimitedContractSize: false } },
  mocha: { timeout: 3600000 },
};
