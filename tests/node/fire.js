// Fires one CloudEvent to the events exchange, as a Node service would: the cloudevents SDK writes it
// (binary or structured content mode, as for HTTP: ce- headers), amqplib publishes it with a confirm.
// Usage: node fire.js AMQP_URL binary|structured TYPE ID DATA_JSON [KEY [with-slot]]
// With KEY: the event's partitionkey; "with-slot" also sets the event_slot header, the CRC-32 of KEY modulo 64.
const amqp = require("amqplib");
const zlib = require("zlib");
const { CloudEvent, HTTP } = require("cloudevents");

async function main() {
  const [url, mode, type, id, data, key, slot] = process.argv.slice(2);
  const event = new CloudEvent({
    type,
    id,
    source: "urn:node:checkout",
    datacontenttype: "application/json",
    data: JSON.parse(data),
    ...(key ? { partitionkey: key } : {}),
  });
  const { headers, body } = mode === "structured" ? HTTP.structured(event) : HTTP.binary(event);
  const { "content-type": contentType, ...attributes } = headers;
  if (slot === "with-slot") {
    attributes.event_slot = String(zlib.crc32(Buffer.from(key, "utf8")) % 64);
  }
  const connection = await amqp.connect(url);
  try {
    const channel = await connection.createConfirmChannel();
    channel.publish("events", type, Buffer.from(body), { headers: attributes, contentType, persistent: true });
    await channel.waitForConfirms();
  } finally {
    await connection.close();
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
