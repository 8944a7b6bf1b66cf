"""serve_app.client against the running service."""

import asyncio

import pytest

from serve_app.client import AsyncClient, Client, ServeAppHTTPError


def test_client_translates_and_embeds(serve_url):
    with Client(serve_url) as client:
        assert client.ready()
        assert client.translate(["Life is like a box of chocolates."], source="en", target="pt") == [
            "A vida é como uma caixa de chocolates."]
        vectors = client.embed(["The food was delicious.", "Good morning."])
        assert len(vectors) == 2 and all(len(v) == 384 for v in vectors)
        assert {m["task"] for m in client.models()} == {"translation", "embeddings", "prediction"}  # + iris
        with pytest.raises(ServeAppHTTPError) as err:
            client.translate(["Hallo"], source="de", target="pt")
        assert err.value.status_code == 400 and err.value.error_type == "unsupported_language_pair"


def test_async_client_concurrent_calls(serve_url):
    async def go():
        async with AsyncClient(serve_url) as client:
            return await asyncio.gather(*(client.translate([f"Good morning number {i}."], source="en", target="pt")
                                          for i in range(8)))

    results = asyncio.run(go())
    assert len(results) == 8 and all(r[0] for r in results)
