// Runs a turn that stops at an approval through AG-UI's TypeScript client, then answers the
// interrupts the client itself keeps (pendingInterrupts) with a resume, and prints what it saw.
// Usage: node resume.mjs BASE_URL THREAD_ID AGENT_JSON TEXT
import { HttpAgent } from "@ag-ui/client";

const [url, threadId, agentJson, text] = process.argv.slice(2);
const agent = new HttpAgent({
  url: `${url}/v1/agui/run`,
  threadId,
  initialMessages: [{ id: `${threadId}-input`, role: "user", content: text }],
});
const forwardedProps = { agent: JSON.parse(agentJson) };
const first = [];
const second = [];
let outcome = null;
await agent.runAgent({ runId: "run-1", forwardedProps }, {
  onEvent: ({ event }) => {
    first.push(event.type);
    if (event.type === "RUN_FINISHED") outcome = event.outcome ?? null;
  },
});
const pending = agent.pendingInterrupts.map((i) => i.id);
const resume = pending.map((interruptId) => ({ interruptId, status: "resolved", payload: true }));
await agent.runAgent({ runId: "run-2", forwardedProps, resume }, {
  onEvent: ({ event }) => { second.push(event.type); },
});
console.log(JSON.stringify({
  first, second, outcome, pending, left: agent.pendingInterrupts.length, messages: agent.messages,
  state: agent.state,
}));
