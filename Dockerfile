# The cdc pipeline as a slim, non-root image. Build: docker build -t outbox-cdc .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cdc ./cdc
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /app cdc
WORKDIR /app
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY schemas ./schemas
COPY slot_setup ./slot_setup
USER cdc
ENV CDC_SCHEMAS_DIR=/app/schemas
ENTRYPOINT ["cdc"]
CMD ["run"]
