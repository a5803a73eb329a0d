"""When the router traces (router.tracing): only when the standard OTEL_* variables
ask for OTLP traces; otherwise no tracer is set up at all."""

from __future__ import annotations

import os

import pytest
from autellix_vllm.router import tracing
from autellix_vllm.router.tracing import tracer_from_environment, tracing_asked

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


@pytest.mark.parametrize(
    ("environ", "asked"),
    [
        ({}, False),
        (ENDPOINT, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, False),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({**ENDPOINT, "OTEL_SDK_DISABLED": "false"}, True),
        ({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, False),
        ({**ENDPOINT, "OTEL_TRACES_EXPORTER": "console"}, False),
        ({**ENDPOINT, "OTEL_TRACES_EXPORTER": "console,otlp"}, True),
        ({**ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, False),
        ({**ENDPOINT, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, True),
        # Only the endpoint of metrics or logs: no traces.
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:4318"}, False),
    ],
)
def test_the_otel_variables_that_ask_for_traces(environ, asked):
    assert tracing_asked(environ) is asked


def test_without_the_variables_no_tracer_is_set_up(monkeypatch):
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)

    def no_provider(*args, **kwargs):
        raise AssertionError("a tracer provider was made")

    monkeypatch.setattr(tracing, "ProgramTracer", no_provider)
    assert tracer_from_environment() is None


def test_the_default_service_name_and_the_one_the_variables_give(monkeypatch):
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    for service_name, expected in ((None, "autellix-router"), ("my-router", "my-router")):
        if service_name is not None:
            monkeypatch.setenv("OTEL_SERVICE_NAME", service_name)
        tracer = tracer_from_environment()
        assert tracer is not None
        assert tracer.provider.resource.attributes["service.name"] == expected
        tracer.shutdown()  # nothing was traced: nothing is sent
