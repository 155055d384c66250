"""A stream's chunks that wait together are read as one response: a client that reads slower than
its worker sends gets every token that has arrived in its next message (docs/scale.md, run 10),
never merged across choices or past a choice's last chunk; a reader that keeps up gets each chunk
as it was sent."""

import asyncio
import threading

import grpc
import pytest
from intentserve.common.streaming import END
from intentserve.controller.router import coalesce
from intentserve.controller.router.mux_streams import AsyncMuxStream, StreamFailed, hand_over
from intentserve.v1 import inference_pb2, inference_pb2_grpc

from tests.controller.conftest import ready

LENGTH = inference_pb2.FINISH_REASON_LENGTH
STOP = inference_pb2.FINISH_REASON_STOP


class FakeMux:
    def cancel(self, key: int) -> bool:
        return True


def chunk(token: int, *, index: int = 0, finish: int = 0) -> inference_pb2.GenerateResponse:
    return inference_pb2.GenerateResponse(
        request_id="r1",
        token_ids=[token],
        text=f"<{token}>",
        reasoning=f"r{token}",
        num_output_tokens=token + 1,
        logprobs=[
            inference_pb2.TokenLogprobs(
                chosen=inference_pb2.LogprobEntry(token_id=token, logprob=-float(token))
            )
        ],
        index=index,
        finish_reason=finish,
        num_prompt_tokens=5 if finish else 0,
    )


async def responses(stream: AsyncMuxStream) -> list[inference_pb2.GenerateResponse]:
    return [r async for r in stream]


def test_every_field_of_a_response_has_a_rule_for_merging():
    rules = coalesce.APPENDED + coalesce.CONCATENATED + coalesce.SAME + coalesce.LATEST
    assert sorted(rules) == sorted(f.name for f in inference_pb2.GenerateResponse.DESCRIPTOR.fields)


def test_chunks_that_waited_together_are_one_response_with_all_their_tokens():
    async def scenario():
        stream = AsyncMuxStream(FakeMux(), 1, asyncio.get_running_loop())
        hand_over([(stream, chunk(0)), (stream, chunk(1))])  # two engine steps' messages
        hand_over([(stream, chunk(2, finish=LENGTH)), (stream, END)])
        return await responses(stream)

    [merged] = asyncio.run(scenario())
    assert list(merged.token_ids) == [0, 1, 2]
    assert merged.text == "<0><1><2>"
    assert merged.reasoning == "r0r1r2"  # a thinking model's reasoning, concatenated as text is
    assert [lp.chosen.token_id for lp in merged.logprobs] == [0, 1, 2]
    assert [lp.chosen.logprob for lp in merged.logprobs] == [0.0, -1.0, -2.0]
    assert merged.num_output_tokens == 3  # the last chunk's running count
    assert merged.finish_reason == LENGTH and merged.num_prompt_tokens == 5
    assert merged.request_id == "r1" and merged.index == 0


def test_a_reader_that_keeps_up_gets_each_chunk_as_it_was_sent():
    async def scenario():
        loop = asyncio.get_running_loop()
        stream = AsyncMuxStream(FakeMux(), 2, loop)
        got = []
        for token in range(4):
            hand_over([(stream, chunk(token, finish=LENGTH if token == 3 else 0))])
            got.append(await stream.__anext__())
        hand_over([(stream, END)])
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        return got

    assert [list(r.token_ids) for r in asyncio.run(scenario())] == [[0], [1], [2], [3]]


def test_choices_are_never_merged_into_each_other_nor_past_a_choices_last_chunk():
    async def scenario():
        stream = AsyncMuxStream(FakeMux(), 3, asyncio.get_running_loop())
        hand_over(
            [
                (stream, chunk(0, index=0)),
                (stream, chunk(1, index=0)),
                (stream, chunk(10, index=1)),
                (stream, chunk(2, index=0, finish=STOP)),
                (stream, chunk(11, index=1)),
                (stream, chunk(12, index=1, finish=LENGTH)),
                (stream, END),
            ]
        )
        return await responses(stream)

    got = [(r.index, list(r.token_ids), r.finish_reason) for r in asyncio.run(scenario())]
    assert got == [(0, [0, 1], 0), (1, [10], 0), (0, [2], STOP), (1, [11, 12], LENGTH)]

    async def finished_first():
        stream = AsyncMuxStream(FakeMux(), 4, asyncio.get_running_loop())
        # NOTE: a worker sends nothing of a choice after its last chunk; were it to, the finished
        # chunk would still be read as the last of what came before it
        hand_over([(stream, chunk(0, finish=STOP)), (stream, chunk(1)), (stream, END)])
        return await responses(stream)

    assert [list(r.token_ids) for r in asyncio.run(finished_first())] == [[0], [1]]


def test_a_failure_after_waiting_chunks_comes_after_their_tokens():
    async def scenario():
        stream = AsyncMuxStream(FakeMux(), 5, asyncio.get_running_loop())
        failure = StreamFailed(grpc.StatusCode.UNAVAILABLE, "worker w0 was lost")
        hand_over([(stream, chunk(0)), (stream, chunk(1)), (stream, failure)])
        first = await stream.__anext__()
        with pytest.raises(StreamFailed) as error:
            await stream.__anext__()
        return first, error.value

    first, error = asyncio.run(scenario())
    assert list(first.token_ids) == [0, 1]
    assert error.code() is grpc.StatusCode.UNAVAILABLE


def read_all(address: str, *, pause=lambda: None, options=()) -> tuple[int, list[int], str]:
    """One request's stream read by a client that calls `pause` after the first message:
    (messages, token ids, text)."""
    request = inference_pb2.GenerateRequest(
        prompt="hi", stop=inference_pb2.StopConditions(max_tokens=NUM_TOKENS)
    )
    messages, tokens, text = 0, [], ""
    with grpc.insecure_channel(address, options=options) as channel:
        for response in inference_pb2_grpc.InferenceStub(channel).Generate(request, timeout=30):
            if not messages:
                pause()
            messages += 1
            tokens.extend(response.token_ids)
            text += response.text
    return messages, tokens, text


NUM_TOKENS = 3000
# A client whose HTTP/2 window is small: once it holds 4 KiB it has not read, the router's
# writes to it wait (with gRPC's default window the router's writes go out at once: 3000 tokens
# of a few bytes fit in it).
SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 4096)]


@pytest.mark.integration
def test_a_slow_client_gets_its_backlog_in_few_messages_and_every_token_in_order(
    start_controller, make_worker, monkeypatch
):
    server, worker = ready(start_controller, make_worker, num_tokens=NUM_TOKENS, token_delay_s=0)
    # NOTE: the slow client waits until the router's stream holds the worker's last message, not
    # for a fixed time after the worker sent it: on a loaded host the messages crossing to the
    # router took longer than 0.2 s, and those that came after the client read again went out
    # one by one (875 messages in one CI run)
    ended = threading.Event()
    put = AsyncMuxStream._put

    def put_and_note_the_end(stream: AsyncMuxStream, item: object) -> None:
        put(stream, item)
        if item is END:
            ended.set()

    monkeypatch.setattr(AsyncMuxStream, "_put", put_and_note_the_end)

    def until_the_router_holds_all() -> None:
        assert ended.wait(30), "the router's stream never received the worker's last message"

    fast = read_all(server.address)
    ended.clear()
    slow = read_all(server.address, pause=until_the_router_holds_all, options=SMALL_WINDOW)
    assert len(fast[1]) == NUM_TOKENS
    assert slow[1:] == fast[1:]  # the same tokens and text, in order
    # the router merged what waited for the slow client (3000 messages before the change)
    assert slow[0] < NUM_TOKENS / 4, f"{slow[0]} messages for {NUM_TOKENS} tokens"
