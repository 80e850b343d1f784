// Drives the `pulse review` page in Debian's chromium over a pending
// stack of two transactions, an edit and its fix, that both change one
// file: node stack.mjs URL EDIT_ID FIX_ID BIDI_PATH MODE_PATH UNTICK_PATH [SCREENSHOT]
//
// It prints one JSON line per step: "shown" (what the page shows of the
// file named with a direction control, of its diff line and of the mode
// change), "explained" (the message after clicking Commit on the fix
// alone), and "committed" (after unticking UNTICK_PATH and clicking
// Commit all: the message, and what it shows of BIDI_PATH).
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [url, editID, fixID, bidiPath, modePath, untickPath, shot] = process.argv.slice(2);
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
  const edit = page.locator(`article.tx[data-tx="${editID}"]`);
  const fix = page.locator(`article.tx[data-tx="${fixID}"]`);
  await edit.waitFor();
  await fix.waitFor();

  // The file named with a direction control: its name as the page lays
  // it out, the marker, the badge, and the diff line holding an isolate.
  const bidiFile = edit.locator(".file").filter({ has: page.locator(".path mark.bidi") }).first();
  await bidiFile.waitFor();
  const pathText = await bidiFile.locator(".path").textContent();
  const markers = await bidiFile.locator(".path mark.bidi").allTextContents();
  const badge = await bidiFile.locator(".flag.bidi").textContent();
  const markerStyle = await bidiFile.locator(".path mark.bidi").first().evaluate((m) => getComputedStyle(m).backgroundColor);
  const lineMarkers = await edit.locator("pre.diff span.add mark.bidi").allTextContents();
  const rawInPage = await page.evaluate(() => /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/.test(document.body.innerText));
  const modeFile = edit.locator(".file", { hasText: modePath });
  const modeBadge = await modeFile.locator(".flag.mode").textContent();
  const modeLines = await modeFile.locator("pre.diff span.mode").allTextContents();
  step("shown", { pathText, markers, badge, markerStyle, lineMarkers, rawInPage, modeBadge, modeLines, wanted: bidiPath });

  // The fix alone cannot be committed: the button says why.
  await fix.getByRole("button", { name: "Commit", exact: true }).click();
  await page.locator("#message", { hasText: "cannot be committed alone" }).waitFor();
  const explained = await page.locator("#message").textContent();
  const dependsNote = await fix.locator("div.depends").textContent();
  step("explained", { message: explained, note: dependsNote, stillPending: await fix.count() });
  if (shot) {
    await page.screenshot({ path: shot, fullPage: true });
    step("screenshot", { path: shot });
  }

  await edit.getByRole("checkbox", { name: "accept " + untickPath }).uncheck();
  await page.getByRole("button", { name: "Commit all", exact: true }).click();
  await page.locator("#message", { hasText: "Committed the pending stack" }).waitFor();
  await edit.waitFor({ state: "detached" });
  await fix.waitFor({ state: "detached" });
  // The message names the committed paths, the one with a direction
  // control among them: as a marker too, never as the raw rune.
  const rawAfter = await page.evaluate(() => /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/.test(document.body.innerText));
  const messageMarkers = await page.locator("#message mark.bidi").allTextContents();
  step("committed", { message: await page.locator("#message").textContent(), errors, rawAfter, messageMarkers });
} finally {
  await ctx.close();
  rmSync(profile, { recursive: true, force: true });
}
