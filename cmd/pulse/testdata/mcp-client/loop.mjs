// An agent's edit → build → test → fix loop through `pulse mcp`, driven by
// the official MCP TypeScript SDK: write the code and its test, run the
// test (it fails), fix, run it again (it passes), commit the whole stack.
// Usage: node loop.mjs PULSE [ARGS...]
// It prints one JSON report on stdout; mcp_node_test.go checks it.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [command, ...args] = process.argv.slice(2);
const transport = new StdioClientTransport({ command, args, env: { ...process.env }, stderr: "inherit" });
const client = new Client({ name: "pulse-mcp-loop-test", version: "1.0.0" });
await client.connect(transport);

const report = { steps: {} };
async function call(step, name, args) {
  const r = await client.callTool({ name, arguments: args });
  report.steps[step] = {
    isError: r.isError === true,
    text: (r.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n"),
    structured: r.structuredContent ?? null,
  };
  return report.steps[step];
}

const test = `. ./calc.sh
mkdir -p build
got=$(add 2 3)
echo "add 2 3 = $got" > build/report.txt
[ "$got" = 5 ] || { echo "FAIL: add 2 3 = $got" >&2; exit 1; }
echo PASS
`;
await call("write_code", "write_file", { path: "calc.sh", content: "add() { echo $(($1 - $2)); }\n" });
await call("write_test", "write_file", { path: "test.sh", content: test });
await call("test_fails", "execute", { command: "sh test.sh" });
await call("read_code", "read_file", { path: "calc.sh" });
await call("fix", "write_file", { path: "calc.sh", content: "add() { echo $(($1 + $2)); }\n" });
await call("test_passes", "execute", { command: "sh test.sh" });
await call("commit", "commit", {});
await call("diff_after", "diff", {});

await client.close();
process.stdout.write(JSON.stringify(report, null, 2) + "\n");
