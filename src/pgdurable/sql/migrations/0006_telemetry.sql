-- pgdurable schema, version 6: the trace context (W3C traceparent, as a JSON object) of the code that
-- enqueued an execution, so that its workflow's spans join that trace (see tracing.py).
ALTER TABLE workflow_executions ADD COLUMN trace_context jsonb;
