"""A served model's options (docs/served-models.md): `--model openai:NAME@URL` or `--endpoint URL --model NAME`, the
key's environment variable, and how requests are sent. `readout run` and `readout nsi` take them with the model."""

from __future__ import annotations

import click

from cli.options import bounded, param_names, refuse_given
from contract.options import COUNT, INDEX, TEMPERATURE
from engine.errors import ReadoutError

SERVED_OPTIONS = (
    click.option("--served-cache", default=None, type=click.Path(file_okay=False), help="served models: the request "
                 "cache folder (default <cache>/served); a rerun reads its replies instead of sending again"),
    click.option("--request-timeout", default=120.0, show_default=True, type=bounded(TEMPERATURE),
                 help="served models: seconds per request"),
    click.option("--backoff", default=1.0, show_default=True, type=bounded(TEMPERATURE), help="served models: seconds "
                 "before the first retry (doubled each time)"),
    click.option("--retries", default=5, show_default=True, type=bounded(INDEX), help="served models: retries of a "
                 "request on 429/5xx/timeouts, with exponential backoff"),
    click.option("--concurrency", default=4, show_default=True, type=bounded(COUNT), help="served models: requests in flight"),
    click.option("--top-logprobs", default=20, show_default=True, type=bounded(COUNT), help="served models: top-k "
                 "logprobs asked for at each read position (the unseen remainder is bounded per row)"),
    click.option("--api-key-env", default=None, metavar="VAR", help="environment variable holding the endpoint's API "
                 "key (its value is sent in the Authorization header only, never recorded)"),
    click.option("--endpoint", default=None, help="base URL of an OpenAI-compatible API (e.g. http://127.0.0.1:8080/v1): "
                 "--model is then the model name it serves (same as --model openai:NAME@URL)"),
)
"""--endpoint, --api-key-env, --top-logprobs, --concurrency, --retries, --backoff, --request-timeout, --served-cache."""
SERVED_NAMES = param_names(SERVED_OPTIONS)


def served_spec(model: str, values: dict):
    """(model name, ServedSpec or None) from the served options, which it pops from `values`. Options that only a
    served model reads are refused beside a local model, unless left at their defaults."""
    from engine.served import ServedSpec, parse_served
    from engine.served_client import ClientSettings

    names = tuple(values)
    endpoint = values.pop("endpoint")
    settings = dict(key_env=values.pop("api_key_env"), top_logprobs=values.pop("top_logprobs"), cache=values.pop("served_cache"))
    client = ClientSettings(concurrency=values.pop("concurrency"), retries=values.pop("retries"), backoff=values.pop("backoff"),
                            timeout=values.pop("request_timeout"))
    where = parse_served(model, endpoint)
    if where is None:
        refuse_given([n for n in names if n in SERVED_NAMES], f"read for served models only; '{model}' is a local model")
        return model, None
    if not 1 <= settings["top_logprobs"] <= 100:
        raise ReadoutError(f"--top-logprobs: {settings['top_logprobs']} must be in 1..100")
    if client.concurrency < 1 or client.retries < 0 or client.backoff < 0 or client.timeout <= 0:
        raise ReadoutError("--concurrency must be >= 1, --retries and --backoff >= 0, --request-timeout > 0")
    name, url = where
    return name, ServedSpec(name=name, url=url, client=client, **settings)


SERVED = (SERVED_OPTIONS, served_spec)
"""What `cli.options.model_options(served=SERVED)` takes for a command that also reads served models."""
