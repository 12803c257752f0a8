#!/usr/bin/env node
// Runs an ONNX model in ONNX Runtime (onnxruntime-node, CPU execution provider) on raw float32
// NCHW input and writes the model's first output as raw float32 (both little-endian).
//
//   node tests/ort/ort_run.js --model M.onnx --input in.bin --shape N,C,H,W --output out.bin
//        [--opt disabled|basic|extended|all] [--x64quantprecision] [--threads K] [--batch B]
//        [--no-spinning] [--warmup] [--verbose]
//
// --opt sets the session's graphOptimizationLevel (default all, ORT's own default);
// --x64quantprecision sets the session config entry session.x64quantprecision = "1" (ORT's
// slower u8 x s8 kernels that do not saturate on x64 CPUs without VNNI); --threads the intra-op
// threads (default 2; inter-op 1, sequential execution); --batch the images per run call
// (default 256; a model whose batch dimension is fixed runs in batches of that size, and N must
// be a multiple of it); --no-spinning stops ORT's worker threads from spin-waiting between
// tasks (session.intra_op/inter_op.allow_spinning = "0"; for tests on shared cores); --warmup
// runs the first batch once before the timed runs (benchmarks); --verbose turns on ORT's verbose log (on stderr: the session options with their config
// entries, the kernels chosen).
//
// Prints one JSON line on stdout: model, input and output names, output dims, ORT version,
// options, session creation and run times (ms). Exit status 0 on success, 1 on any error (a
// message on stderr starting "ort_run: ").
'use strict';

const fs = require('fs');
const os = require('os');
const path = require('path');

class UsageError extends Error {}

const USAGE =
  'usage: node tests/ort/ort_run.js --model M.onnx --input in.bin --shape N,C,H,W --output out.bin\n' +
  '       [--opt disabled|basic|extended|all] [--x64quantprecision] [--threads K] [--batch B]\n' +
  '       [--no-spinning] [--warmup] [--verbose]';

const OPT_LEVELS = ['disabled', 'basic', 'extended', 'all'];

function parseArgs(argv) {
  const a = { opt: 'all', threads: 2, batch: 256, x64quantprecision: false, spinning: true, verbose: false,
    warmup: false };
  const valued = { '--model': 'model', '--input': 'input', '--shape': 'shape', '--output': 'output',
    '--opt': 'opt', '--threads': 'threads', '--batch': 'batch' };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--help' || arg === '-h') {
      process.stdout.write(USAGE + '\n');
      process.exit(0);
    } else if (arg === '--x64quantprecision') {
      a.x64quantprecision = true;
    } else if (arg === '--no-spinning') {
      a.spinning = false;
    } else if (arg === '--warmup') {
      a.warmup = true;
    } else if (arg === '--verbose') {
      a.verbose = true;
    } else if (Object.prototype.hasOwnProperty.call(valued, arg)) {
      if (i + 1 >= argv.length) throw new UsageError(`${arg} needs a value`);
      a[valued[arg]] = argv[++i];
    } else {
      throw new UsageError(`unknown argument '${arg}'`);
    }
  }
  for (const k of ['model', 'input', 'shape', 'output']) {
    if (a[k] === undefined) throw new UsageError(`--${k} is required`);
  }
  if (!OPT_LEVELS.includes(a.opt)) {
    throw new UsageError(`--opt must be one of ${OPT_LEVELS.join(', ')}, not '${a.opt}'`);
  }
  a.threads = positiveInt('--threads', a.threads);
  a.batch = positiveInt('--batch', a.batch);
  const dims = String(a.shape).split(',');
  if (dims.length !== 4) throw new UsageError(`--shape must be N,C,H,W (4 positive integers), not '${a.shape}'`);
  a.shape = dims.map((d) => positiveInt('--shape', d));
  return a;
}

function positiveInt(name, v) {
  const s = String(v);
  if (!/^[0-9]+$/.test(s) || Number(s) < 1 || !Number.isSafeInteger(Number(s))) {
    throw new UsageError(`${name} expects positive integers, not '${s}'`);
  }
  return Number(s);
}

function loadOrt() {
  const dir = path.join(__dirname, 'node_modules', 'onnxruntime-node');
  if (!fs.existsSync(path.join(dir, 'package.json'))) {
    throw new Error(`onnxruntime-node is not installed (no ${dir}): run scripts/setup.sh ` +
      `(or: cd tests/ort && ONNXRUNTIME_NODE_INSTALL=skip npm ci)`);
  }
  const ort = require(dir);
  const version = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8')).version;
  return { ort, version };
}

function dimsToString(d) {
  return '[' + d.join(', ') + ']';
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  if (os.endianness() !== 'LE') throw new Error('this runner reads and writes little-endian float32 on little-endian hosts only');

  const [N, C, H, W] = a.shape;
  const imageFloats = C * H * W;
  let st;
  try {
    st = fs.statSync(a.model);
  } catch (e) {
    throw new Error(`cannot open model ${a.model}: ${e.code === 'ENOENT' ? 'no such file' : e.message}`);
  }
  if (!st.isFile()) throw new Error(`model ${a.model} is not a regular file`);
  try {
    st = fs.statSync(a.input);
  } catch (e) {
    throw new Error(`cannot open input ${a.input}: ${e.code === 'ENOENT' ? 'no such file' : e.message}`);
  }
  const want = N * imageFloats * 4;
  if (st.size !== want) {
    throw new Error(`input ${a.input} has ${st.size} bytes; --shape ${a.shape.join(',')} needs ` +
      `${N}*${C}*${H}*${W}*4 = ${want} (raw little-endian float32, NCHW)`);
  }

  const { ort, version } = loadOrt();
  const options = {
    executionProviders: ['cpu'],
    graphOptimizationLevel: a.opt,
    intraOpNumThreads: a.threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    logSeverityLevel: a.verbose ? 0 : 3,
  };
  // The Node.js binding passes `extra` on as session config entries, its keys joined with '.'
  // (here "session.x64quantprecision"), through AddSessionConfigEntry; --verbose shows them
  // in ORT's log of the session options (config_options: { session.x64quantprecision: 1 }).
  const session = {};
  if (a.x64quantprecision) session.x64quantprecision = '1';
  if (!a.spinning) {
    session.intra_op = { allow_spinning: '0' };
    session.inter_op = { allow_spinning: '0' };
  }
  if (Object.keys(session).length) options.extra = { session };

  const t0 = process.hrtime.bigint();
  let sess;
  try {
    sess = await ort.InferenceSession.create(a.model, options);
  } catch (e) {
    throw new Error(`ONNX Runtime cannot load ${a.model}: ${e.message}`);
  }
  const t1 = process.hrtime.bigint();

  if (sess.inputNames.length !== 1) {
    throw new Error(`model ${a.model} has ${sess.inputNames.length} inputs (${sess.inputNames.join(', ')}); this runner feeds exactly one`);
  }
  const inName = sess.inputNames[0];
  const outName = sess.outputNames[0];
  const inMeta = sess.inputMetadata ? sess.inputMetadata[0] : undefined;
  let batch = Math.min(a.batch, N);
  if (inMeta && inMeta.isTensor) {
    if (inMeta.type !== 'float32') throw new Error(`model input '${inName}' is ${inMeta.type}, not float32`);
    const ms = inMeta.shape;
    if (ms.length !== 4) throw new Error(`model input '${inName}' has shape ${dimsToString(ms)}, not 4-D NCHW`);
    for (let i = 1; i < 4; i++) {
      if (typeof ms[i] === 'number' && ms[i] !== a.shape[i]) {
        throw new Error(`model input '${inName}' is ${dimsToString(ms)}; --shape ${a.shape.join(',')} does not fit it`);
      }
    }
    if (typeof ms[0] === 'number' && ms[0] > 0) {
      if (N % ms[0] !== 0) {
        throw new Error(`model input '${inName}' has a fixed batch of ${ms[0]}; N = ${N} is not a multiple of it`);
      }
      batch = ms[0];
    }
  }

  const tmp = a.output + '.tmp';
  const fin = fs.openSync(a.input, 'r');
  let fout;
  try {
    fout = fs.openSync(tmp, 'w');
  } catch (e) {
    fs.closeSync(fin);
    throw new Error(`cannot write ${tmp}: ${e.message}`);
  }
  let outDims = null;
  let runNs = 0n;
  try {
    const buf = Buffer.alloc(batch * imageFloats * 4);
    if (a.warmup) { // the first batch once, untimed and not written (kernels are prepared on first use)
      const nb = Math.min(batch, N);
      const bytes = nb * imageFloats * 4;
      if (fs.readSync(fin, buf, 0, bytes, 0) !== bytes) throw new Error(`short read from ${a.input}`);
      const x = new Float32Array(nb * imageFloats);
      Buffer.from(x.buffer).set(buf.subarray(0, bytes));
      await sess.run({ [inName]: new ort.Tensor('float32', x, [nb, C, H, W]) }, [outName]);
    }
    for (let n0 = 0; n0 < N; n0 += batch) {
      const nb = Math.min(batch, N - n0);
      const bytes = nb * imageFloats * 4;
      const got = fs.readSync(fin, buf, 0, bytes, n0 * imageFloats * 4);
      if (got !== bytes) throw new Error(`short read from ${a.input} at image ${n0}`);
      // a copy: a Float32Array over the Buffer's memory needs 4-byte alignment
      const x = new Float32Array(nb * imageFloats);
      Buffer.from(x.buffer).set(buf.subarray(0, bytes));
      const feeds = { [inName]: new ort.Tensor('float32', x, [nb, C, H, W]) };
      const r0 = process.hrtime.bigint();
      let res;
      try {
        res = await sess.run(feeds, [outName]);
      } catch (e) {
        throw new Error(`ONNX Runtime failed on images ${n0}..${n0 + nb - 1}: ${e.message}`);
      }
      runNs += process.hrtime.bigint() - r0;
      const y = res[outName];
      if (y.type !== 'float32') throw new Error(`output '${outName}' is ${y.type}, not float32`);
      if (y.dims[0] !== nb) throw new Error(`output '${outName}' has dims ${dimsToString(y.dims)}; expected ${nb} rows`);
      const rest = y.dims.slice(1);
      if (outDims === null) outDims = rest;
      else if (rest.join(',') !== outDims.join(',')) throw new Error(`output '${outName}' changes shape between batches`);
      const d = y.data;
      fs.writeSync(fout, Buffer.from(d.buffer, d.byteOffset, d.byteLength));
    }
    fs.fsyncSync(fout);
  } catch (e) {
    fs.closeSync(fout);
    fs.closeSync(fin);
    fs.rmSync(tmp, { force: true });
    throw e;
  }
  fs.closeSync(fout);
  fs.closeSync(fin);
  fs.renameSync(tmp, a.output);
  if (sess.release) await sess.release();

  process.stdout.write(JSON.stringify({
    model: a.model,
    input: inName,
    output: outName,
    dims: [N, ...outDims],
    ort_version: version,
    opt: a.opt,
    x64quantprecision: a.x64quantprecision,
    threads: a.threads,
    spinning: a.spinning,
    batch,
    warmup: a.warmup,
    session_ms: Number(t1 - t0) / 1e6,
    run_ms: Number(runNs) / 1e6,
  }) + '\n');
}

main().catch((e) => {
  process.stderr.write(`ort_run: ${e.message}\n`);
  if (e instanceof UsageError) process.stderr.write(USAGE + '\n');
  process.exitCode = 1;
});
