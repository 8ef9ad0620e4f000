# One image, two entry points: `brain serve` and `hands serve --route NAME --tools MODULE` (or
# `--mcp SPEC`); docker-compose.yml runs both, the example mailbox and an MCP pool from it.
FROM python:3.11-slim

WORKDIR /app
# Exactly what the package is: pyproject's packages.find (brain, hands, protocol, infra, examples)
# and its package-data; README.md is the project's readme. .dockerignore keeps caches out.
COPY pyproject.toml README.md ./
COPY brain brain
COPY hands hands
COPY protocol protocol
COPY infra infra
COPY local local
COPY examples examples
# The optional extras the image carries (pyproject's optional-dependencies): `mcp`, the official
# MCP SDK, so a Hands container serves MCP servers' tools (`hands serve --mcp`) and a Brain serves
# agents at /mcp (TENDON_MCP_AGENTS). `--build-arg EXTRAS=` builds the image without it.
ARG EXTRAS=mcp
# Every dependency ships as a wheel for this Python, so no compiler is installed; the build's
# leftovers go in the same layer.
RUN pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}" \
    && rm -rf build tendon.egg-info \
    && useradd --create-home --uid 10001 tendon \
    && mkdir -p /app/.tendon /var/lib/tendon \
    && chown tendon:tendon /app/.tendon /var/lib/tendon

# Not root. Its home keeps `brain watch`'s resume points (~/.cache); /app stays read-only to it but
# for .tendon/, where `brain demo` and `brain serve --local` keep their data. /var/lib/tendon holds
# what a service of the image keeps (docker-compose.yml's mailbox: a volume mounted there takes
# its owner). Relative paths such as examples/notice_agent.json resolve from /app.
USER tendon
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TENDON_LOG_FORMAT=json
CMD ["brain", "serve"]
