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


def test_client_jobs_give_what_the_blocking_calls_give(serve_url):
    import uuid

    texts = [f"The garden {i} is green ({uuid.uuid4().hex[:6]})." for i in range(12)]
    with Client(serve_url) as client:
        job = client.submit_translation(texts, source="en", target="pt")
        vectors_job = client.submit_embeddings(texts[:3])
        assert job.result(timeout=120) == client.translate(texts, source="en", target="pt")
        assert len(vectors_job.result(timeout=120)) == 3 and job.status() == "succeeded"
        with pytest.raises(ServeAppHTTPError) as raised:
            client.submit_translation(["x"], source="en", target="xx")
        assert raised.value.error_type == "unsupported_language_pair"

    async def submit_async():
        async with AsyncClient(serve_url) as client:
            job = await client.submit_predict("iris", [{"sepal_length_cm": 5.1, "sepal_width_cm": 3.5,
                                                        "petal_length_cm": 1.4, "petal_width_cm": 0.2}])
            return await job

    assert asyncio.run(submit_async())[0]["species"] == "setosa"
