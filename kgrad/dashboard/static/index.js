// Entry point of the kgrad tab: TensorBoard imports this module in an iframe
// and calls render(). Data comes from this plugin's routes, next to this file.
import { startApp } from "./app.js";

async function getJSON(route, params = {}) {
  const url = new URL(route, import.meta.url);
  for (const [key, value] of Object.entries(params)) url.searchParams.set(key, value);
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${route}: ${response.status} ${await response.text()}`);
  return response.json();
}

export async function render() {
  const style = document.createElement("link");
  style.rel = "stylesheet";
  style.href = new URL("./style.css", import.meta.url).href;
  document.head.append(style);
  const root = document.createElement("div");
  root.id = "kgrad-root";
  document.body.append(root);
  await startApp(root, {
    runs: () => getJSON("runs"),
    heatmap: (run, quantity) => getJSON("heatmap", { run, quantity }),
    summary: (run) => getJSON("summary", { run }),
    histogram: (run, tag) => getJSON("histogram", { run, tag }),
    stability: (run) => getJSON("stability", { run }),
  });
}
