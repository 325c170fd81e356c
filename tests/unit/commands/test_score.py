from __future__ import annotations

import pytest


async def test_ctrl_c_interrupts_a_running_task_group() -> None:
    import asyncio
    import os
    import signal

    from grm_service.commands.score import _until_interrupted

    finished = []

    async def work() -> None:
        async with asyncio.TaskGroup() as group:
            for _ in range(3):
                group.create_task(asyncio.sleep(10))
        finished.append(True)

    asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        await _until_interrupted(work())
    assert finished == []
