// Opens the `pulse review` page in Debian's chromium as a person would,
// then another server on 127.0.0.1 (another port), whose page fetches
// itself with credentials, as any local page can:
// node otherport.mjs URL OTHER_URL
// It prints one JSON line per step.
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [url, other] = process.argv.slice(2);
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
  await page.goto(url);
  await page.locator("#live", { hasText: "live" }).waitFor();
  await page.locator("article.tx").first().waitFor();
  step("loaded", { location: page.url() });
  await page.goto(other);
  await page.locator("#done").waitFor();
  step("other");
} finally {
  await ctx.close();
  rmSync(profile, { recursive: true, force: true });
}
