// Validates an AsyncAPI document with the AsyncAPI initiative's own parser (@asyncapi/parser).
// Prints every diagnostic as a JSON line; exits 1 when the document has an error.
// Usage: node asyncapi.js FILE
const fs = require("fs");
const { Parser } = require("@asyncapi/parser");

async function main() {
  const { document, diagnostics } = await new Parser().parse(fs.readFileSync(process.argv[2], "utf8"));
  for (const { severity, code, message, path } of diagnostics) {
    console.log(JSON.stringify({ severity, code, message, path }));
  }
  const errors = diagnostics.filter((diagnostic) => diagnostic.severity === 0);
  if (!document || errors.length) {
    process.exit(1);
  }
  console.log(JSON.stringify({ channels: document.channels().length, operations: document.operations().length }));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
