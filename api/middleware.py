"""Every API call made with a known token is written down: which token, what, the answer, how long."""

from __future__ import annotations

import logging
import time

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.utils.decorators import sync_and_async_middleware

from api.models import ApiCall

log = logging.getLogger(__name__)


def _record(request, response, started: float) -> None:
    token = getattr(request, "api_token", None)
    if token is None:
        return
    try:
        ApiCall.objects.create(
            token=token,
            method=request.method[:8],
            path=request.get_full_path()[:300],
            status=response.status_code,
            problem=getattr(response, "api_problem", "")[:40],
            milliseconds=min(int((time.monotonic() - started) * 1000), 2**31 - 1),
        )
    except Exception:  # the answer stands; a lost audit line is logged, never raised at the caller
        log.exception("could not audit %s %s", request.method, request.path)


@sync_and_async_middleware
def audit_api_calls(get_response):
    if iscoroutinefunction(get_response):

        async def middleware(request):
            started = time.monotonic()
            response = await get_response(request)
            if getattr(request, "api_token", None) is not None:
                await sync_to_async(_record)(request, response, started)
            return response

    else:

        def middleware(request):
            started = time.monotonic()
            response = get_response(request)
            _record(request, response, started)
            return response

    return middleware
