// The gateway's side of a Deno kernel, run silently before the first cell
// (gateway/execution/kernel_code.py sends this file, then calls `prepare`). Plain JavaScript,
// so that it is valid TypeScript too. It keeps what it needs in a closure, so code that
// replaces `console` later cannot break the gateway's fences.
//
// - prepare({env, vars, fence, network}): the run's environment (Deno.env.set), its
//   `vars` as globals (each valid identifier but input/result/output) and as `input`, and
//   `Deno.exit` (which `process.exit` calls) wrapped: it writes an exit fence through
//   stdout and stderr, so that the gateway sees the program's exit after all its output,
//   then waits for the gateway to end the sandbox (or exits by itself after a while);
//   `Deno.stdout`/`Deno.stderr` writes sent as the kernel's streams (Deno drops them),
//   and Deno's `net` permission revoked unless the run has `network`;
// - fence(label): a fence line through stdout and stderr: Deno sends the kernel's output
//   from another thread, after the cell's `idle`; once the gateway has read a fence from
//   both streams, it has read everything the cell printed before it;
// - result(): `{present, name, value | error}` of `result` (else `output`), shown as
//   application/json.
(() => {
  const key = Symbol.for("gateway.run");
  if (globalThis[key]) return;
  // what console.log and console.error print through: the kernel sends it as streams
  const print = Deno[Deno.internal].core.print;
  const realExit = Deno.exit;
  const sleeper = new Int32Array(new SharedArrayBuffer(4));
  const EXIT_WAIT_MS = 5000;
  const RESERVED = new Set(["input", "result", "output"]);
  const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/;
  let token = "";

  const fence = (label) => {
    const line = `\x1egw-fence:${token}:${label}\n`;
    print(line, false);
    print(line, true);
  };
  // Deno.stdout and Deno.stderr (and process.stdout and process.stderr, which write
  // through them) bypass the kernel's capture: their text would be lost in the kernel's
  // log. Send it where console.log's goes, in order with it.
  const capture = (stream, isError) => {
    const decoder = new TextDecoder();
    const writeSync = (bytes) => {
      print(decoder.decode(bytes, { stream: true }), isError);
      return bytes.length;
    };
    stream.writeSync = writeSync;
    stream.write = (bytes) => Promise.resolve(writeSync(bytes));
  };
  const exit = (code) => {
    const value = code === undefined ? Deno.exitCode : code;
    if (!Number.isInteger(value)) return realExit(code);
    fence(`exit:${((value % 256) + 256) % 256}`);
    Atomics.wait(sleeper, 0, 0, EXIT_WAIT_MS);
    return realExit(value);
  };
  const isGlobalName = (name) => {
    if (!IDENTIFIER.test(name) || RESERVED.has(name)) return false;
    try {
      new Function(`let ${name};`);
      return true;
    } catch {
      return false;
    }
  };
  const read = (name) => {
    try {
      // a lexical `const result` of an earlier cell is not on globalThis: ask the scope
      return (0, eval)(`typeof ${name} === "undefined" ? undefined : ${name}`);
    } catch {
      return undefined;
    }
  };
  const result = () => {
    let payload = { present: false };
    for (const name of ["result", "output"]) {
      const value = read(name);
      if (value === undefined) continue;
      try {
        const text = JSON.stringify(value);
        payload = text === undefined
          ? { present: true, name, error: `a ${typeof value} has no JSON form` }
          : { present: true, name, value: JSON.parse(text) };
      } catch (error) {
        payload = { present: true, name, error: String(error?.message ?? error) };
      }
      break;
    }
    return { [Symbol.for("Jupyter.display")]: () => ({ "application/json": payload }) };
  };
  const prepare = (run) => {
    token = run.fence;
    for (const [name, value] of Object.entries(run.env ?? {})) Deno.env.set(name, value);
    const vars = run.vars ?? {};
    if (Object.keys(vars).length > 0) {
      globalThis.input = { ...vars };
      for (const [name, value] of Object.entries(vars)) {
        if (isGlobalName(name)) globalThis[name] = value;
      }
    }
    Deno.exit = exit;
    capture(Deno.stdout, false);
    capture(Deno.stderr, true);
    // no network unless the run asked for it, on top of the sandbox's: with no prompt,
    // a later Deno.permissions.request is denied
    if (!run.network) Deno.permissions.revokeSync({ name: "net" });
  };
  Object.defineProperty(globalThis, key, { value: Object.freeze({ prepare, fence, result }) });
})();
