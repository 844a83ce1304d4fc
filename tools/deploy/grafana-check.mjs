// Type-checks a Grafana dashboard JSON against Grafana's own published schema types, strictly:
// an unknown field anywhere, a wrong type, a value outside an enum, or a missing required field
// fails. Used by tools/deploy/validate.sh (docs/DEPLOY.md, "What is validated").
//
//   node tools/deploy/grafana-check.mjs DASHBOARD.json NODE_MODULES_DIR
//
// NODE_MODULES_DIR holds (npm): typescript, @grafana/schema (the TypeScript types Grafana
// generates from its CUE schemas: the dashboard, and each panel plugin's Options / FieldConfig),
// @grafana/grafana-foundation-sdk (for the Prometheus query type: @grafana/schema types a
// panel's targets only as Record<string, unknown>).
//
// How: the JSON is written out as TypeScript object literals, one per part, each declared with
// its schema type, and the TypeScript compiler checks them. Object literals get TypeScript's
// excess-property check, so unknown fields fail at any depth. The parts:
//   - the dashboard without its panels: the Dashboard type of @grafana/schema (its "veneer",
//     the shape Grafana's frontend reads: numeric variable `hide`, nullable data sources);
//   - each panel: the raw dashboard schema's Panel with `options` typed by the panel plugin's
//     Options, `fieldConfig.defaults.custom` by its FieldConfig, `targets` by the Prometheus
//     query type; a panel type without a schema here fails.
// Grafana's generated types declare string enums (e.g. ThresholdsMode); a JSON literal is not
// assignable to a TS enum, so every type is mapped through Json<T>, which turns a string enum
// into the union of its values and leaves everything else (numeric enums included) as is.
import fs from "node:fs";
import path from "node:path";
import os from "node:os";
import { createRequire } from "node:module";

const [dashPath, nodeModules] = process.argv.slice(2);
if (!dashPath || !nodeModules) {
  console.error("usage: grafana-check.mjs DASHBOARD.json NODE_MODULES_DIR");
  process.exit(2);
}
const require = createRequire(path.join(path.resolve(nodeModules), "x.js"));
const ts = require("typescript");
const dash = JSON.parse(fs.readFileSync(dashPath, "utf8"));

const S = "@grafana/schema/dist/types";
const PLUGINS = {
  // panel type -> [options type, fieldConfig.custom type]
  timeseries: ["TimeSeries.Options", "TimeSeries.FieldConfig"],
  stat: ["Stat.Options", "Record<string, never>"],
};

const lit = (v) => JSON.stringify(v, null, 2);
const parts = [];
const { panels = [], ...rest } = dash;
parts.push({ name: "dashboard (without panels)", type: "Json<Omit<Dashboard, 'panels'>>", value: rest });
for (const p of panels) {
  const plugin = PLUGINS[p.type];
  const name = `panel id=${p.id} "${p.title}" (${p.type})`;
  if (!plugin) {
    console.log(`FAIL ${name}: no schema here for panel type ${JSON.stringify(p.type)} (known: ${Object.keys(PLUGINS).join(", ")})`);
    process.exitCode = 1;
    continue;
  }
  parts.push({ name, type: `PanelOf<${plugin[0]}, ${plugin[1]}> & { type: ${JSON.stringify(p.type)} }`, value: p });
}

let src = `
import type { Dashboard } from "${S}/index";
import type * as Raw from "${S}/raw/dashboard/x/types.gen";
import type * as TimeSeries from "${S}/raw/composable/timeseries/panelcfg/x/types.gen";
import type * as Stat from "${S}/raw/composable/stat/panelcfg/x/types.gen";
import type * as Prometheus from "@grafana/grafana-foundation-sdk/dist/prometheus/types.gen";

// A string enum -> the union of its string values; arrays and objects mapped field by field.
type Json<T> =
  T extends (...args: any[]) => any ? never :
  T extends string ? \`\${T}\` :
  T extends number | boolean | null | undefined ? T :
  T extends ReadonlyArray<infer U> ? Array<Json<U>> :
  T extends object ? { [K in keyof T]: Json<T[K]> } :
  T;

type PromQuery = Omit<Prometheus.Dataquery, "_implementsDataqueryVariant">;
type PanelOf<O, C> = Json<Omit<Raw.Panel, "options" | "fieldConfig" | "targets" | "type">> & {
  options?: Json<O>;
  fieldConfig?: {
    defaults: Json<Omit<Raw.FieldConfig, "custom">> & { custom?: Json<C> };
    overrides: Json<Raw.FieldConfigSource["overrides"]>;
  };
  targets?: Array<Json<PromQuery>>;
};
`;
const ranges = [];
parts.forEach((part, i) => {
  const start = src.split("\n").length;
  src += `\n// ${part.name}\nexport const part${i}: ${part.type} = ${lit(part.value)};\n`;
  ranges.push({ start, end: src.split("\n").length, name: part.name });
});

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "grafana-check-"));
const file = path.join(dir, "dashboard.ts");
fs.writeFileSync(file, src);
const options = {
  strict: true,
  exactOptionalPropertyTypes: false,
  noEmit: true,
  skipLibCheck: true,
  target: ts.ScriptTarget.ES2022,
  module: ts.ModuleKind.CommonJS,
  moduleResolution: ts.ModuleResolutionKind.Node10,
  baseUrl: path.resolve(nodeModules),
  types: [],
};
const program = ts.createProgram([file], options);
const diags = ts.getPreEmitDiagnostics(program);
const lines = src.split("\n");
for (const d of diags) {
  const msg = ts.flattenDiagnosticMessageText(d.messageText, " ").replace(/\s+/g, " ");
  if (!d.file || d.file.fileName !== file) {
    console.log(`FAIL ${d.file ? d.file.fileName : "(compiler)"}: ${msg}`);
    continue;
  }
  const { line } = d.file.getLineAndCharacterOfPosition(d.start);
  const part = ranges.find((r) => line + 1 >= r.start && line + 1 <= r.end);
  console.log(`FAIL ${part ? part.name : "preamble"}: line \`${lines[line].trim()}\`: ${msg.slice(0, 600)}`);
}
fs.rmSync(dir, { recursive: true, force: true });
if (diags.length) process.exitCode = 1;
if (!process.exitCode) {
  const pkg = (n) => JSON.parse(fs.readFileSync(path.join(nodeModules, n, "package.json"), "utf8")).version.replace(/^v/, "");
  console.log(
    `ok: ${path.basename(dashPath)}: dashboard + ${panels.length} panels type-check against ` +
      `@grafana/schema ${pkg("@grafana/schema")} (Prometheus queries: @grafana/grafana-foundation-sdk ` +
      `${pkg("@grafana/grafana-foundation-sdk")}), typescript ${ts.version}`,
  );
}
