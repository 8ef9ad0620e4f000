# One image, two entry points: `brain serve` and `hands serve --route NAME --tools MODULE`.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY brain brain
COPY hands hands
COPY protocol protocol
COPY infra infra
COPY examples examples
RUN pip install --no-cache-dir .
ENV PYTHONUNBUFFERED=1 TENDON_LOG_FORMAT=json
CMD ["brain", "serve"]
