// LangGraph's own JavaScript client against Tendon's /langgraph API: argv = base URL, the agent
// definitions (JSON: {greeter, guarded}). Prints one JSON object: what the client read.
import { Client } from "@langchain/langgraph-sdk";

const [url, agentsJson] = process.argv.slice(2);
const agents = JSON.parse(agentsJson);
const client = new Client({ apiUrl: `${url}/langgraph`, apiKey: null });
const input = { messages: [{ role: "user", content: "greet Ada" }] };

const greeter = await client.assistants.create({ graphId: "greeter", context: { agent: agents.greeter } });
const thread = await client.threads.create({ metadata: { user: "ada" } });
const parts = [];
for await (const part of client.runs.stream(thread.thread_id, greeter.assistant_id, {
  input, streamMode: ["messages-tuple", "values"],
})) {
  parts.push({ event: part.event, id: part.id ?? null, data: part.data });
}
const runId = parts[0].data.run_id;
const cut = parts.findIndex((p) => p.event === "messages");
const rest = [];
for await (const part of client.runs.joinStream(thread.thread_id, runId, { lastEventId: parts[cut].id })) {
  rest.push({ event: part.event, id: part.id ?? null, data: part.data });
}
const guarded = await client.assistants.create({ graphId: "guarded", context: { agent: agents.guarded } });
const other = await client.threads.create();
const stopped = await client.runs.wait(other.thread_id, guarded.assistant_id, { input });
const resumed = await client.runs.wait(other.thread_id, guarded.assistant_id, { command: { resume: true } });
const found = await client.threads.search({ metadata: { user: "ada" } });
console.log(JSON.stringify({ parts, rest, cut, stopped, resumed, found: found.map((t) => t.thread_id),
  thread: thread.thread_id }));
