// Drives the `pulse review` page in Debian's chromium, as a person would:
// node review.mjs URL PATH CONTENT LIVE_PATH REJECT_PATH HOOK_PATH [SCREENSHOT]
//
// It opens the page, checks PATH and CONTENT of the pending change are
// shown and that HOOK_PATH is flagged as running on the host and left
// unticked, prints {"step":"loaded"} and waits for LIVE_PATH to appear
// without a reload (the Go test stages it then: a live update), unticks
// REJECT_PATH, clicks "Commit" on the transaction holding PATH and
// "Discard" on the one holding LIVE_PATH, and prints one JSON line per
// step.
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [url, path, content, livePath, rejectPath, hookPath, shot] = process.argv.slice(2);
const step = (name, extra = {}) => console.log(JSON.stringify({ step: name, ...extra }));
const profile = mkdtempSync(join(tmpdir(), "pulse-review-chromium-"));
const ctx = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  viewport: { width: 1280, height: 900 },
});
try {
  const page = ctx.pages()[0] || (await ctx.newPage());
  page.setDefaultTimeout(20000);
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(url);
  const first = page.locator("article.tx", { hasText: path });
  await first.getByText(path, { exact: true }).waitFor();
  await first.locator("pre.diff span.add", { hasText: content }).first().waitFor();
  const chain = await page.locator("#chain").textContent();
  const hook = first.locator(".file", { hasText: hookPath });
  await hook.getByText("runs on the host", { exact: true }).waitFor();
  const hookTicked = await hook.getByRole("checkbox", { name: "accept " + hookPath }).isChecked();
  step("loaded", { location: page.url(), chain, hookTicked });

  const second = page.locator("article.tx", { hasText: livePath });
  await second.getByText(livePath, { exact: true }).waitFor();
  step("live");
  if (shot) {
    await page.screenshot({ path: shot, fullPage: true });
    step("screenshot", { path: shot });
  }

  await first.getByRole("checkbox", { name: "accept " + rejectPath }).uncheck();
  await first.getByRole("button", { name: "Commit", exact: true }).click();
  await page.locator("#message", { hasText: "Committed transaction" }).waitFor();
  await first.waitFor({ state: "detached" });
  step("committed", { message: await page.locator("#message").textContent() });

  await second.getByRole("button", { name: "Discard", exact: true }).click();
  await page.locator("#message", { hasText: "Discarded transaction" }).waitFor();
  await second.waitFor({ state: "detached" });
  step("discarded");

  await page.getByRole("button", { name: "Undo", exact: true }).waitFor();
  const timeline = await page.locator("#timeline").textContent();
  step("timeline", { timeline, errors });
} finally {
  await ctx.close();
  rmSync(profile, { recursive: true, force: true });
}
