// A real annotator session in the Argilla UI, driven in headless Debian Chromium by playwright-core.
//
// Signs in, opens the review dataset, checks that the dialog and the documents are rendered (the
// document titles as markdown headings), replaces the suggested clarification with a corrected one,
// and submits. Screenshots go to SCREENSHOT_DIR. Configuration comes from the environment (the pytest
// wrapper in tests/test_review_argilla.py sets it):
//   ARGILLA_API_URL, ANNOTATOR_USERNAME, ANNOTATOR_PASSWORD, DATASET_ID,
//   EXPECT_TEXTS (JSON list of strings that must be visible), EXPECT_HEADING (a document title),
//   NEW_CLARIFICATION, SCREENSHOT_DIR, CHROMIUM (default /usr/bin/chromium).
// Prints one JSON line with what it saw; exits 1 on any failure (after a screenshot of the failure).
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const env = (name, fallback) => {
  const v = process.env[name] ?? fallback;
  if (v === undefined) throw new Error(`missing environment variable ${name}`);
  return v;
};
const url = env("ARGILLA_API_URL", "http://127.0.0.1:6900").replace(/\/$/, "");
const user = env("ANNOTATOR_USERNAME");
const password = env("ANNOTATOR_PASSWORD");
const datasetId = env("DATASET_ID");
const expectTexts = JSON.parse(env("EXPECT_TEXTS", "[]"));
const expectHeading = env("EXPECT_HEADING", "");
const newClarification = env("NEW_CLARIFICATION");
const shots = env("SCREENSHOT_DIR", "test-artifacts");
mkdirSync(shots, { recursive: true });

const browser = await chromium.launch({
  executablePath: env("CHROMIUM", "/usr/bin/chromium"),
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run"],
});
const page = await browser.newPage({ viewport: { width: 1600, height: 1200 } });
page.setDefaultTimeout(30000);
const seen = { user, datasetId };
try {
  await page.goto(`${url}/sign-in`);
  await page.getByLabel("Username").fill(user);
  await page.getByLabel("Password").fill(password);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForURL((u) => !u.pathname.startsWith("/sign-in"));

  await page.goto(`${url}/dataset/${datasetId}/annotation-mode`);
  await page.locator(".button--submit").waitFor();
  for (const text of expectTexts) {
    await page.getByText(text, { exact: false }).first().waitFor({ state: "visible" });
  }
  seen.texts = expectTexts.length;
  if (expectHeading) {
    // the documents field is markdown: titles must come out as headings, not as "### ..." text
    const heading = page.locator("h3", { hasText: expectHeading }).first();
    await heading.waitFor({ state: "visible" });
    seen.heading = (await heading.innerText()).trim();
    seen.rawMarkdownVisible = await page.getByText("### ", { exact: false }).count();
  }

  const box = page.locator("[contenteditable='true']").first();
  seen.suggested = (await box.innerText()).trim();
  await box.click();
  await page.keyboard.press("Control+A");
  await page.keyboard.press("Delete");
  await page.keyboard.type(newClarification);
  seen.typed = (await box.innerText()).trim();
  await page.screenshot({ path: join(shots, "review_annotate_before_submit.png") });

  const answered = page.waitForResponse(
    (r) => /\/api\/v1\/(records\/[^/]+\/responses|responses\/[^/]+)$/.test(r.url()) && r.request().method() !== "GET",
  );
  await page.locator(".button--submit").click();
  const resp = await answered;
  seen.status = resp.status();
  seen.response = await resp.json();
  await page.waitForTimeout(500);
  await page.screenshot({ path: join(shots, "review_annotate_after_submit.png") });
  console.log(JSON.stringify(seen));
  await browser.close();
  if (seen.status >= 300) process.exit(1);
} catch (err) {
  await page.screenshot({ path: join(shots, "review_annotate_failure.png") }).catch(() => {});
  console.log(JSON.stringify({ ...seen, error: String(err) }));
  await browser.close();
  process.exit(1);
}
