// Reads events fired as CloudEvents, as a Node service would: amqplib consumes a queue of its own bound to
// the events exchange, the cloudevents SDK reads each message (binary mode: ce- headers, like HTTP). Events fired
// with a delay arrive through the delay ladder's delivery exchange: the queue is bound there too, to the
// destination "event.<name>" after the 22 words of the delay.
// Prints "ready", then one JSON line per event: its type, id, source, time, specversion and data.
// Usage: node consume.js AMQP_URL ROUTING_KEY COUNT
const amqp = require("amqplib");
const { HTTP } = require("cloudevents");

async function main() {
  const [url, routingKey, count] = process.argv.slice(2);
  const connection = await amqp.connect(url);
  const channel = await connection.createChannel();
  await channel.checkExchange("events");
  const { queue } = await channel.assertQueue("", { exclusive: true });
  await channel.bindQueue(queue, "events", routingKey);
  await channel.bindQueue(queue, "amqp_events.delivery", "*.".repeat(22) + "event." + routingKey);
  let left = Number(count);
  await channel.consume(queue, async (message) => {
    const headers = { ...message.properties.headers, "content-type": message.properties.contentType };
    const event = HTTP.toEvent({ headers, body: message.content.toString("utf8") });
    const { type, id, source, time, specversion, data } = event;
    console.log(JSON.stringify({ type, id, source, time, specversion, data }));
    channel.ack(message);
    if (--left === 0) {
      await connection.close();
    }
  });
  console.log("ready");
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
