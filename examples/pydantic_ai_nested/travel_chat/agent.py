"""The travel agent: a Pydantic AI agent whose two tools take nested objects, made durable on Temporal.

``plan_trip(request: TripRequest)`` and ``book_room(booking: RoomBooking)`` take objects holding objects,
enums and lists (a party of ``Traveller``s, each of a ``TravellerKind``; a ``DateRange``; a ``RoomType``
and a list of ``Extra``s), so the JSON schemas the model is shown nest with ``$defs``, ``enum``,
``anyOf`` and ``format: date``. Both are pure: they compute an answer from their arguments and call
nothing (``book_room`` quotes a room and gives the booking a reference derived from it; it reserves
nothing anywhere).

Its model is ``OpenAIChatModel`` (OpenAI's Chat Completions API, not streamed) at the endpoint in
``OPENAI_BASE_URL`` (unset: OpenAI's). The ``TemporalDurability`` capability runs every model request and
every tool call as a Temporal activity.
"""

from __future__ import annotations

import hashlib
import os
from datetime import date, timedelta
from enum import Enum

from pydantic import BaseModel, Field
from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import TemporalDurability
from pydantic_ai.models.openai import OpenAIChatModel
from temporalio.workflow import ActivityConfig


class TravellerKind(str, Enum):
    adult = "adult"
    child = "child"
    infant = "infant"


class Traveller(BaseModel):
    name: str = Field(description="the traveller's name")
    kind: TravellerKind
    age: int | None = Field(None, ge=0, le=120, description="age in years, for children and infants")


class DateRange(BaseModel):
    start: date = Field(description="the first day (check-in)")
    end: date = Field(description="the last day (check-out)")


class TripRequest(BaseModel):
    destination: str = Field(description="city or region")
    travellers: list[Traveller] = Field(min_length=1, description="everyone who travels")
    dates: DateRange
    interests: list[str] = Field(default_factory=list, description="e.g. museums, hiking, food")


class RoomType(str, Enum):
    single = "single"
    double = "double"
    twin = "twin"
    family = "family"
    suite = "suite"


class Extra(str, Enum):
    breakfast = "breakfast"
    parking = "parking"
    late_checkout = "late_checkout"
    airport_transfer = "airport_transfer"
    cot = "cot"


class RoomBooking(BaseModel):
    hotel: str
    room_type: RoomType
    guests: list[Traveller] = Field(min_length=1)
    dates: DateRange
    extras: list[Extra] = Field(default_factory=list)


class TripPlan(BaseModel):
    destination: str
    nights: int
    party: str
    days: list[str]
    suggested_room: RoomType


class RoomQuote(BaseModel):
    reference: str
    hotel: str
    room_type: RoomType
    nights: int
    total_eur: int
    note: str = ""


NIGHTLY_EUR = {RoomType.single: 80, RoomType.double: 110, RoomType.twin: 110, RoomType.family: 160,
               RoomType.suite: 260}
EXTRA_EUR = {Extra.breakfast: 15, Extra.parking: 20, Extra.late_checkout: 30, Extra.airport_transfer: 45,
             Extra.cot: 0}  # breakfast and parking per night, the rest once


MAX_DAYS = 31  # the longest day-by-day plan plan_trip writes


def _nights(dates: DateRange) -> int:
    return max(0, (dates.end - dates.start).days)


def _party(travellers: list[Traveller]) -> str:
    counts = {k: sum(t.kind is k for t in travellers) for k in TravellerKind}
    return ", ".join(f"{n} {k.value}{'s' if n > 1 else ''}" for k, n in counts.items() if n)


agent = Agent(
    # Built here, where the worker imports this module: a model name resolved in workflow code would import
    # the OpenAI model module inside Temporal's sandbox.
    OpenAIChatModel(os.environ.get("TRAVEL_MODEL", "gpt-4.1-mini")),
    name="travel_agent",
    instructions=("You are a travel assistant. Plan trips with plan_trip and book hotel rooms with book_room; "
                  "ask for what you need to fill in their arguments."),
    capabilities=[TemporalDurability(activity_config=ActivityConfig(start_to_close_timeout=timedelta(seconds=60)))],
)


@agent.tool_plain
def plan_trip(request: TripRequest) -> TripPlan:
    """Plan a day-by-day trip for a party of travellers.

    Args:
        request: where, who and when, and what the travellers like.
    """
    nights = _nights(request.dates)
    interests = request.interests or ["the old town"]
    # At most MAX_DAYS lines: dates decades apart (a model can send them) would otherwise make a plan of
    # megabytes, past Temporal's payload limit, and the conversation's workflow tasks would fail from then on.
    days = [f"{request.dates.start + timedelta(days=i)}: {interests[i % len(interests)]}"
            for i in range(min(nights + 1, MAX_DAYS))]
    if nights + 1 > MAX_DAYS:
        days.append(f"... and {nights + 1 - MAX_DAYS} more days: plan them in shorter trips")
    young = any(t.kind is not TravellerKind.adult for t in request.travellers)
    room = RoomType.family if young else RoomType.single if len(request.travellers) == 1 else RoomType.double
    return TripPlan(destination=request.destination, nights=nights, party=_party(request.travellers), days=days,
                    suggested_room=room)


@agent.tool_plain
def book_room(booking: RoomBooking) -> RoomQuote:
    """Book a hotel room: returns its price and a booking reference.

    Args:
        booking: the hotel, room type, guests, dates and extras.
    """
    nights = _nights(booking.dates)
    total = NIGHTLY_EUR[booking.room_type] * nights + sum(
        EXTRA_EUR[e] * (nights if e in (Extra.breakfast, Extra.parking) else 1) for e in set(booking.extras))
    # Derived from the booking itself: the same booking always gets the same reference.
    reference = hashlib.sha256(booking.model_dump_json().encode()).hexdigest()[:8].upper()
    note = "" if nights else "check-out must be after check-in: no nights booked"
    return RoomQuote(reference=reference, hotel=booking.hotel, room_type=booking.room_type, nights=nights,
                     total_eur=total, note=note)
