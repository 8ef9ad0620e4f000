"""Both frameworks' test agents in one module, as a user's module may hold them: the Pydantic AI
agent (policies by ``@policy``) and the OpenAI Agents SDK agent (policies by ``TENDON_TOOLS``).
The end-to-end tests serve each module alone, so a pool imports one framework."""

from tests.framework_notes import Answer, noted
from tests.framework_pydantic_agents import geo, lab, spare
from tests.framework_sdk_agents import TENDON_TOOLS, sdk

__all__ = ["TENDON_TOOLS", "Answer", "geo", "lab", "noted", "sdk", "spare"]
