// Drives `pulse mcp` with the official MCP TypeScript SDK, as an agent's
// client would: spawn the server over stdio, list the tools, call each.
// Usage: node client.mjs PULSE [ARGS...]
// It prints one JSON report on stdout; mcp_node_test.go checks it.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [command, ...args] = process.argv.slice(2);
const transport = new StdioClientTransport({ command, args, env: { ...process.env }, stderr: "inherit" });
const client = new Client({ name: "pulse-mcp-node-test", version: "1.0.0" });
await client.connect(transport);

const report = { server: client.getServerVersion(), steps: {} };
report.tools = (await client.listTools()).tools.map((t) => t.name).sort();

async function call(step, name, args) {
  const r = await client.callTool({ name, arguments: args });
  report.steps[step] = {
    isError: r.isError === true,
    text: (r.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n"),
    structured: r.structuredContent ?? null,
  };
  return report.steps[step];
}

const ex = await call("execute", "execute", { command: "echo out; echo changed > a.txt; printf new > sub/new.txt" });
const tx = ex.structured?.transaction;
await call("execute_cwd_env", "execute", { command: 'echo "$GREETING from $(basename "$PWD")"', cwd: "sub", env: { GREETING: "hi" }, timeout_seconds: 60 });
await call("execute_timeout", "execute", { command: "sleep 30", timeout_seconds: 1 });
await call("execute_denied", "execute", { command: "curl http://example.invalid/" });
await call("read_file", "read_file", { path: "a.txt" });
await call("read_outside", "read_file", { path: "../../etc/passwd" });
await call("list_files", "list_files", {});
await call("write_file", "write_file", { path: "notes.md", content: "# notes\n" });
await call("write_outside", "write_file", { path: "../outside.txt", content: "x" });
await call("write_denied", "write_file", { path: "secret/key.txt", content: "x" });
await call("diff_all", "diff", {});
await call("diff_one", "diff", { id: tx });
await call("commit_one", "commit", { id: tx });
await call("read_after_commit", "read_file", { path: "a.txt" });
await call("discard_all", "discard", {});
await call("diff_after", "diff", {});
await call("commit_unknown", "commit", { id: "no-such-transaction" });

await client.close();
process.stdout.write(JSON.stringify(report, null, 2) + "\n");
