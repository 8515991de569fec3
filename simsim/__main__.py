"""``python -m simsim``: run the built-in demo scenario and print what happened."""

from __future__ import annotations

from simsim.demo import build_demo_engine


def main() -> None:
    """Run the demo: eight requests, one cancelled before it runs, and print a table."""
    engine = build_demo_engine()
    while (now := engine.run_next_timestamp()) is not None:
        if now >= 150_000 and engine.requests[4].state.name == "WAITING":
            engine.cancel_request(4)
    print("simsim demo: single-slot server, FCFS, simulated costs (not measured hardware)")
    header = f"{'id':>3} {'state':<10} {'arrival':>9} {'admit':>9} {'first tok':>9} {'finish':>9}"
    print(header)
    print("-" * len(header))
    for request in engine.requests.values():
        cells = [
            request.arrival_time_us,
            request.admit_time_us,
            request.first_token_time_us,
            request.finish_time_us,
        ]
        text = " ".join(f"{'-' if c is None else c:>9}" for c in cells)
        print(f"{request.request_id:>3} {request.state.name:<10} {text}")
    print(f"times in microseconds; {engine.processed_event_count} events processed")


if __name__ == "__main__":
    main()
