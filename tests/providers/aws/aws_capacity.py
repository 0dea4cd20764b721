"""A fake of EC2's capacity reservations and Capacity Blocks (moto 5.2.5 has neither: no
DescribeCapacityBlockOfferings / PurchaseCapacityBlock / DescribeCapacityReservations), with the
documented request and response shapes (botocore's EC2 model: CapacityBlockOffering,
PurchaseCapacityBlockResult, CapacityReservation) and the launch rules EC2 applies to them.

Offerings: `offer(region, type, zone, start_in_h, fee, segments)` scripts them (`segments`:
zones of the CapacityBlockOfferingSegments an offering is made of; a purchase then makes one
reservation per segment, answered in CapacityReservations); by default a request for a
type gets one offering, in the first zone moto offers the type in, starting now, at
FAKE_RATE_USD per instance-hour (a fake figure; real prices come from AWS). The answer is paged
like the API's (NextToken; `page` offerings a page, or MaxResults). A purchase makes a
capacity-block reservation that is `payment-pending` for `pending_polls` describes, then
`scheduled` until its start, then `active`, until its end. `odcr(...)` scripts On-Demand
Capacity Reservations.

Launch rules (RunInstances targeting a reservation; answered with an EC2 error, which stops
moto, and recorded in `refusals`):
- the reservation must exist, be `active` and match type and count ("You can only launch an
  instance into a Capacity Reservation that: has matching attributes (instance type, platform,
  Availability Zone, and tenancy), has sufficient available capacity, is in the active state",
  "Launch instances into an existing Capacity Reservation", EC2 User Guide);
- in its zone ("Your instance can't launch in a subnet in a different Availability Zone from
  the Availability Zone where your Capacity Block is located", "Launch instances using
  Capacity Blocks");
- a Capacity Block only with InstanceMarketOptions.MarketType = capacity-block, and that market
  only into a Capacity Block ("To use your Capacity Block, you must specify the Capacity Block
  reservation ID", same page; InstanceMarketOptionsRequest.MarketType, EC2 API Reference);
- inside the block's time window: not after 30 minutes before its end, when EC2 starts
  terminating its instances ("Monitor Capacity Blocks using EventBridge").
The error codes are the fake's choice where the documents name none.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FAKE_RATE_USD = 31.464  # per instance-hour: a made-up figure for tests, not an AWS price
TERMINATION_LEAD = dt.timedelta(minutes=30)
_ids = itertools.count(1)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


@dataclass
class CapacityFake:
    offers: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    reservations: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> item
    region_of: dict[str, str] = field(default_factory=dict)  # reservation id -> region
    polls: dict[str, int] = field(default_factory=dict)
    pending_polls: int = 2
    refusals: list[str] = field(default_factory=list)
    purchases: int = 0
    page: int = 100  # offerings per answer without MaxResults
    forced_state: dict[str, str] = field(default_factory=dict)  # reservation id -> state
    members: dict[str, list[str]] = field(default_factory=dict)  # reservation -> instances
    live: Any = None  # (region, instance ids) -> how many still run (set by conftest)
    # what time it is for EC2: a test moving time on (a block starting in hours) sets the
    # same clock here and in capacity.CLOCK
    clock: Callable[[], dt.datetime] = _now

    # --- scripting -------------------------------------------------------------------------
    def offer(self, region: str, instance_type: str, zone: str, *, start_in_h: float = 0,
              hours: int = 24, count: int = 2, fee: float | None = None,
              segments: list[str] | None = None) -> dict[str, Any]:
        start = self.clock().replace(microsecond=0) + dt.timedelta(hours=start_in_h)
        item = {
            "CapacityBlockOfferingId": f"cb-{next(_ids):017x}", "InstanceType": instance_type,
            "AvailabilityZone": zone, "InstanceCount": count, "StartDate": start,
            "EndDate": start + dt.timedelta(hours=hours), "CapacityBlockDurationHours": hours,
            "CapacityBlockDurationMinutes": 0, "CurrencyCode": "USD", "Tenancy": "default",
            "UpfrontFee": f"{fee if fee is not None else FAKE_RATE_USD * hours * count:.2f}",
        }
        if segments:
            share = count // len(segments)
            item["CapacityBlockOfferingSegments"] = [{
                "InstanceType": instance_type, "AvailabilityZone": z, "InstanceCount": share,
                "StartDate": start, "EndDate": item["EndDate"],
                "CapacityBlockDurationHours": hours, "CurrencyCode": "USD",
                "UpfrontFee": f"{float(item['UpfrontFee']) / len(segments):.2f}"}
                for z in segments]
        self.offers.setdefault((region, instance_type), []).append(item)
        return item

    def odcr(self, region: str, instance_type: str, zone: str, *, available: int = 2,
             state: str = "active", placement_group: str | None = None) -> str:
        rid = f"cr-{next(_ids):017x}"
        self.reservations[rid] = {
            "CapacityReservationId": rid, "InstanceType": instance_type,
            "AvailabilityZone": zone, "InstancePlatform": "Linux/UNIX", "Tenancy": "default",
            "TotalInstanceCount": available, "AvailableInstanceCount": available,
            "State": state, "EndDateType": "unlimited", "InstanceMatchCriteria": "targeted",
            "ReservationType": "default", "Tags": [],
            **({"PlacementGroupArn": f"arn:aws:ec2:{region}:123456789012:placement-group/"
                f"{placement_group}"} if placement_group else {}),
        }
        self.region_of[rid] = region
        return rid

    # --- the operations ----------------------------------------------------------------------
    def answer(self, op: str, params: dict[str, Any], region: str,
               zones_of: Any) -> tuple[int, dict[str, Any]] | None:
        if op == "DescribeCapacityBlockOfferings":
            return self._offerings(params, region, zones_of)
        if op == "PurchaseCapacityBlock":
            return self._purchase(params, region)
        if op == "DescribeCapacityReservations":
            return self._describe(params, region)
        if op == "RunInstances" and params.get("CapacityReservationSpecification"):
            return self._launch(params, region)
        if op == "RunInstances" and (params.get("InstanceMarketOptions") or {}).get(
                "MarketType") == "capacity-block":
            return self._refuse("InvalidParameterCombination",
                                "MarketType capacity-block needs a Capacity Block reservation id")
        return None

    def _refuse(self, code: str, message: str) -> tuple[int, dict[str, Any]]:
        self.refusals.append(f"{code}: {message}")
        return 400, {"Error": {"Code": code, "Message": message}}

    def _offerings(self, params: dict[str, Any], region: str,
                   zones_of: Any) -> tuple[int, dict[str, Any]]:
        for key in ("InstanceType", "InstanceCount", "CapacityDurationHours"):
            if key not in params:
                return self._refuse("MissingParameter", f"{key} is required")
        hours, count = int(params["CapacityDurationHours"]), int(params["InstanceCount"])
        days = hours // 24
        # "1-day increments up to 14 days, and in 7-day increments up to 182 days";
        # "Each Capacity Block can have up to 64 instances" (Find and purchase Capacity Blocks)
        if hours % 24 or not (1 <= days <= 14 or (days % 7 == 0 and days <= 182)):
            return self._refuse("InvalidParameterValue", f"CapacityDurationHours {hours}")
        if not 1 <= count <= 64:
            return self._refuse("InvalidParameterValue", f"InstanceCount {count}")
        itype = params["InstanceType"]
        if (region, itype) not in self.offers:
            zones = zones_of(region, itype)
            if zones:
                self.offer(region, itype, zones[0], hours=hours, count=count)
        start_min = params.get("StartDateRange")
        out = [copy.deepcopy(o) for o in self.offers.get((region, itype), [])
               if o["InstanceCount"] == count and o["CapacityBlockDurationHours"] == hours
               and (start_min is None or o["StartDate"] >= start_min - dt.timedelta(minutes=5))]
        first = int(params.get("NextToken") or 0)
        size = int(params.get("MaxResults") or self.page)
        answer: dict[str, Any] = {"CapacityBlockOfferings": out[first:first + size]}
        if first + size < len(out):
            answer["NextToken"] = str(first + size)
        return 200, answer

    def _purchase(self, params: dict[str, Any], region: str) -> tuple[int, dict[str, Any]]:
        offer = next((o for (r, _), offers in self.offers.items() if r == region
                      for o in offers if o["CapacityBlockOfferingId"] ==
                      params.get("CapacityBlockOfferingId")), None)
        if offer is None:
            return self._refuse("InvalidCapacityBlockOfferingId.NotFound",
                                str(params.get("CapacityBlockOfferingId")))
        if params.get("InstancePlatform") != "Linux/UNIX":
            return self._refuse("InvalidParameterValue", "InstancePlatform")
        self.purchases += 1
        tags = [t for s in params.get("TagSpecifications", []) for t in s.get("Tags", [])]
        made = []
        for part in offer.get("CapacityBlockOfferingSegments") or [offer]:  # one per segment
            rid = f"cr-{next(_ids):017x}"
            item = {
                "CapacityReservationId": rid, "InstanceType": part["InstanceType"],
                "AvailabilityZone": part["AvailabilityZone"], "InstancePlatform": "Linux/UNIX",
                "Tenancy": "default", "TotalInstanceCount": part["InstanceCount"],
                "AvailableInstanceCount": part["InstanceCount"], "State": "payment-pending",
                "StartDate": part["StartDate"], "EndDate": part["EndDate"],
                "EndDateType": "limited", "InstanceMatchCriteria": "targeted",
                "ReservationType": "capacity-block", "CapacityBlockId": f"cb-{rid[3:]}",
                "Tags": tags,
            }
            self.reservations[rid] = item
            self.region_of[rid] = region
            made.append(copy.deepcopy(item))
        self.offers = {k: [o for o in v if o is not offer] for k, v in self.offers.items()}
        return 200, {"CapacityReservation": made[0], "CapacityReservations": made}

    def _state(self, item: dict[str, Any]) -> str:
        """A block's state now: payment-pending for a few polls, scheduled, active, expired."""
        rid = item["CapacityReservationId"]
        if rid in self.forced_state:
            return self.forced_state[rid]
        if item["ReservationType"] != "capacity-block":
            return str(item["State"])
        self.polls[rid] = self.polls.get(rid, 0) + 1
        if self.polls[rid] <= self.pending_polls:
            return "payment-pending"
        now = self.clock()
        if now < item["StartDate"]:
            return "scheduled"
        return "active" if now < item["EndDate"] else "expired"

    def _describe(self, params: dict[str, Any], region: str) -> tuple[int, dict[str, Any]]:
        ids = params.get("CapacityReservationIds")
        mine = {k: v for k, v in self.reservations.items() if self.region_of[k] == region}
        if ids:
            missing = [i for i in ids if i not in mine]
            if missing:
                return self._refuse("InvalidCapacityReservationId.NotFound", missing[0])
        out = []
        for rid, item in mine.items():
            if ids and rid not in ids:
                continue
            item["State"] = self._state(item)
            item["AvailableInstanceCount"] = self.available(rid)
            if not _matches(item, params.get("Filters") or []):
                continue
            out.append(copy.deepcopy(item))
        return 200, {"CapacityReservations": out}

    def _launch(self, params: dict[str, Any], region: str) -> tuple[int, dict[str, Any]] | None:
        target = params["CapacityReservationSpecification"].get("CapacityReservationTarget") or {}
        rid = target.get("CapacityReservationId")
        item = self.reservations.get(rid or "")
        if item is None or self.region_of[rid] != region:
            return self._refuse("InvalidCapacityReservationId.NotFound", str(rid))
        block = item["ReservationType"] == "capacity-block"
        market = (params.get("InstanceMarketOptions") or {}).get("MarketType")
        count = int(params.get("MaxCount", 1))
        zone = (params.get("Placement") or {}).get("AvailabilityZone")
        if block and market != "capacity-block":
            return self._refuse("InvalidParameterCombination",
                                f"{rid} is a Capacity Block: MarketType must be capacity-block")
        if not block and market == "capacity-block":
            return self._refuse("InvalidParameterCombination", f"{rid} is not a Capacity Block")
        if zone != item["AvailabilityZone"]:
            return self._refuse("InvalidParameterValue", f"{rid} is in "
                                f"{item['AvailabilityZone']}, the launch asks for {zone}")
        if params.get("InstanceType") != item["InstanceType"]:
            return self._refuse("InvalidParameterValue", f"{rid} reserves {item['InstanceType']}")
        state = self._state(item) if block else item["State"]
        if block and state == "active" and self.clock() > item["EndDate"] - TERMINATION_LEAD:
            state = "ending"
        if state != "active":
            return self._refuse("InvalidCapacityReservationId.State", f"{rid} is {state}")
        if count > self.available(rid):
            # EC2's error codes: "ReservationCapacityExceeded: The targeted Capacity
            # Reservation does not have enough available capacity" (EC2 API Reference)
            return self._refuse("ReservationCapacityExceeded",
                                f"{rid} has {self.available(rid)} available, {count} asked")
        return None  # moto launches the instances; `joined` records them

    def joined(self, rid: str, instance_ids: list[str]) -> None:
        self.members.setdefault(rid, []).extend(instance_ids)

    def available(self, rid: str) -> int:
        """Total minus the reservation's instances that still run (a terminated one frees
        its slot: "If you terminate an instance running in the Capacity Block before the
        reservation ends, you can launch a new instance in its place")."""
        item = self.reservations[rid]
        members = self.members.get(rid, [])
        live = self.live(self.region_of[rid], members) if members else 0
        return int(item["TotalInstanceCount"]) - live


def _matches(item: dict[str, Any], filters: list[dict[str, Any]]) -> bool:
    for flt in filters:
        name, values = flt["Name"], flt["Values"]
        if name == "instance-type" and item["InstanceType"] not in values:
            return False
        if name == "state" and item["State"] not in values:
            return False
        if name.startswith("tag:") and not any(
                t["Key"] == name[4:] and t["Value"] in values for t in item.get("Tags", [])):
            return False
        if name == "tag-key" and not any(t["Key"] in values for t in item.get("Tags", [])):
            return False
    return True
