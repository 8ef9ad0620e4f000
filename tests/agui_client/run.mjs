// Runs one Tendon agent turn through AG-UI's own TypeScript client (@ag-ui/client's HttpAgent,
// which checks that the events follow AG-UI's rules), and prints the messages it built as JSON.
// Usage: node run.mjs BASE_URL THREAD_ID RUN_ID AGENT_JSON TEXT
import { HttpAgent } from "@ag-ui/client";

const [url, threadId, runId, agentJson, text] = process.argv.slice(2);
const agent = new HttpAgent({
  url: `${url}/v1/agui/run`,
  threadId,
  initialMessages: [{ id: `${runId}-input`, role: "user", content: text }],
});
const types = [];
const result = await agent.runAgent(
  { runId, forwardedProps: { agent: JSON.parse(agentJson) } },
  { onEvent: ({ event }) => { types.push(event.type); } },
);
console.log(JSON.stringify({ types, messages: agent.messages, newMessages: result.newMessages }));
