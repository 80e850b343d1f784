// Runs a plan of tool calls against `pulse mcp` with the official MCP
// TypeScript SDK, as an agent's client would.
// Usage: node calls.mjs PLAN.json PULSE [ARGS...]
// The plan is a list of steps: {"step", "tool", "args"} calls a tool;
// {"step", "fetch"} GETs a URL from this (host) side, as a person's
// browser would. A string argument "${STEP.FIELD}REST" is replaced by
// that field of an earlier step's structured result, followed by REST
// (with no REST, by the field's value itself, a number staying a number).
// It prints one JSON report on stdout; mcp_node_test.go checks it.
import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [planFile, command, ...args] = process.argv.slice(2);
const plan = JSON.parse(readFileSync(planFile, "utf8"));
const transport = new StdioClientTransport({ command, args, env: { ...process.env }, stderr: "inherit" });
const client = new Client({ name: "pulse-mcp-plan-test", version: "1.0.0" });
await client.connect(transport);

const report = { tools: (await client.listTools()).tools.map((t) => t.name).sort(), steps: {} };
const fill = (v) => {
  if (typeof v === "string") {
    const m = /^\$\{(\w+)\.(\w+)\}(.*)$/s.exec(v);
    if (m) {
      const got = report.steps[m[1]]?.structured?.[m[2]];
      return m[3] === "" ? got : String(got) + m[3];
    }
    return v;
  }
  if (Array.isArray(v)) return v.map(fill);
  if (v && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, fill(x)]));
  return v;
};
for (const s of plan) {
  if (s.fetch) {
    try {
      const r = await fetch(fill(s.fetch));
      report.steps[s.step] = { isError: !r.ok, text: await r.text(), structured: { status: r.status } };
    } catch (e) {
      report.steps[s.step] = { isError: true, text: String(e), structured: null };
    }
    continue;
  }
  const r = await client.callTool({ name: s.tool, arguments: fill(s.args ?? {}) });
  report.steps[s.step] = {
    isError: r.isError === true,
    text: (r.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n"),
    structured: r.structuredContent ?? null,
  };
}
await client.close();
process.stdout.write(JSON.stringify(report, null, 2) + "\n");
