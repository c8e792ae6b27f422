// SPDX-License-Identifier: BSD-2-Clause
// A real browser's view of HTTP/2 (tests/e2e/test_h2.py): headless Chromium
// (Debian's, driven by playwright-core) opens N fetch() streams at once to
// one origin and notes when each gets its first event and when each ends.
//
//   node h2_browser.mjs ORIGIN API_KEY N SCREENSHOT
//
// Prints one JSON document: {"protocol", "firsts": [ms], "ends": [ms]}.
import { chromium } from "playwright-core";

const [origin, key, n, shot] = [process.argv[2], process.argv[3],
                                Number(process.argv[4]), process.argv[5]];
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--ignore-certificate-errors"],
});
try {
  const page = await browser.newPage({ ignoreHTTPSErrors: true });
  // Any page of the origin: the streams are then same-origin fetches.
  await page.goto(origin + "/v1/models");
  const out = await page.evaluate(async ({ n, key }) => {
    const t0 = performance.now();
    const firsts = new Array(n).fill(null), ends = new Array(n).fill(null);
    const body = JSON.stringify({ model: "stub", stream: true,
                                  messages: [{ role: "user", content: "hi" }] });
    await Promise.all([...Array(n).keys()].map(async (i) => {
      const r = await fetch("/v1/chat/completions", {
        method: "POST", body,
        headers: { "Authorization": "Bearer " + key, "Content-Type": "application/json",
                   "X-Stub-Events": "3", "X-Stub-Interval-Ms": "1500" },
      });
      const reader = r.body.getReader();
      let got = 0;
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        if (got === 0) firsts[i] = performance.now() - t0;
        got += value.length;
      }
      ends[i] = performance.now() - t0;
    }));
    const nav = performance.getEntriesByType("resource").map((e) => e.nextHopProtocol);
    return { protocol: nav[nav.length - 1] || "", firsts, ends };
  }, { n, key });
  await page.setContent("<pre>" + JSON.stringify(out, null, 1) + "</pre>");
  await page.screenshot({ path: shot });
  console.log(JSON.stringify(out));
} finally {
  await browser.close();
}
