"""The command-line options of a served model (docs/served-models.md), kept beside readouts/cli.py: `--model
openai:NAME@URL` or `--endpoint URL --model NAME`, the key's environment variable, and how requests are sent."""

from __future__ import annotations

import click

from contract.options import COUNT, INDEX, TEMPERATURE
from readouts.options import bounded


def served_options(f):
    """--endpoint, --api-key-env, --top-logprobs, --concurrency, --retries, --backoff, --request-timeout, --served-cache."""
    f = click.option("--endpoint", default=None, help="base URL of an OpenAI-compatible API (e.g. http://127.0.0.1:8080/v1): "
                     "--model is then the model name it serves (same as --model openai:NAME@URL)")(f)
    f = click.option("--api-key-env", default=None, metavar="VAR", help="environment variable holding the endpoint's API "
                     "key (its value is sent in the Authorization header only, never recorded)")(f)
    f = click.option("--top-logprobs", default=20, show_default=True, type=bounded(COUNT), help="served models: top-k logprobs asked "
                     "for at each read position (the unseen remainder is bounded per row)")(f)
    f = click.option("--concurrency", default=4, show_default=True, type=bounded(COUNT), help="served models: requests in flight")(f)
    f = click.option("--retries", default=5, show_default=True, type=bounded(INDEX), help="served models: retries of a request on "
                     "429/5xx/timeouts, with exponential backoff")(f)
    f = click.option("--backoff", default=1.0, show_default=True, type=bounded(TEMPERATURE), help="served models: seconds before the "
                     "first retry (doubled each time)")(f)
    f = click.option("--request-timeout", default=120.0, show_default=True, type=bounded(TEMPERATURE), help="served models: seconds per request")(f)
    f = click.option("--served-cache", default=None, type=click.Path(file_okay=False), help="served models: the request "
                     "cache folder (default <cache>/served); a rerun reads its replies instead of sending again")(f)
    return f


def served_spec(model: str, kwargs: dict):
    """(model name, ServedSpec or None) from the options; pops the served options from `kwargs`."""
    from engine.errors import ReadoutError
    from engine.served import ServedSpec, parse_served
    from engine.served_client import ClientSettings

    endpoint = kwargs.pop("endpoint")
    settings = dict(key_env=kwargs.pop("api_key_env"), top_logprobs=kwargs.pop("top_logprobs"), cache=kwargs.pop("served_cache"))
    client = ClientSettings(concurrency=kwargs.pop("concurrency"), retries=kwargs.pop("retries"), backoff=kwargs.pop("backoff"),
                            timeout=kwargs.pop("request_timeout"))
    where = parse_served(model, endpoint)
    if where is None:
        return model, None
    if not 1 <= settings["top_logprobs"] <= 100:
        raise ReadoutError(f"--top-logprobs: {settings['top_logprobs']} must be in 1..100")
    if client.concurrency < 1 or client.retries < 0 or client.backoff < 0 or client.timeout <= 0:
        raise ReadoutError("--concurrency must be >= 1, --retries and --backoff >= 0, --request-timeout > 0")
    name, url = where
    return name, ServedSpec(name=name, url=url, client=client, **settings)
