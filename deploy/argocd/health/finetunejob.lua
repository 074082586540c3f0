-- Argo CD health check for kubetune.io/FineTuneJob.
--   Pending, Preparing, Training,
--   Registering                    -> Progressing
--   Succeeded                      -> Healthy (Degraded when moving a changed registration.alias failed)
--   Failed                         -> Degraded
--   Suspended                      -> Suspended
-- The message comes from the status: the conditions' messages, training progress, the registered model.
-- Failed: the Ready condition's reason and message ("DiskFull at step 120: ..." as the operator
-- writes a training failure; the reason is put in front of a message that does not begin with it).
-- Succeeded at spec.budget (BudgetReached=True): the model, then the BudgetReached condition's message
-- ("training stopped at spec.budget maxDuration 2h: step 300 of 500 planned; ...").
-- Degraded too, while not final, when a person is needed: a child object kubetune will not overwrite
-- or that the API server forbids (ChildrenReady=False, ChildConflict or ChildForbidden: its message),
-- no training engine to run on (NoTrainingEngine, EngineNotServed, EngineNotImplemented: its message),
-- and training (or preparation: Prepared=False) pods that cannot start (Training=False, Unschedulable, PodsNotCreated,
-- ImagePullFailed or MountFailed: its message; the operator shows a pod waiting for a node only
-- after a while).
-- A child request that failed for a while and is retried (ChildApiError) is Progressing with its
-- message.
--
-- Written for Argo CD's default Lua sandbox (gopher-lua, Lua 5.1, with only the base, table and
-- package libraries): no string, math or os functions, so numbers are formatted with arithmetic
-- alone. A status that is not what the operator writes (wrong types, missing fields) gives a
-- message, never a Lua error.
local hs = {}

local DIGITS = { "0", "1", "2", "3", "4", "5", "6", "7", "8", "9" }
local EXACT = 9007199254740992 -- 2^53: every whole number below it is exact in a float64

local function finite(x)
  return type(x) == "number" and x - x == 0
end

local function floor(x)
  return x - x % 1
end

-- the decimal digits of a whole number 0 <= n < 2^53
local function digits(n)
  local text = ""
  repeat
    local d = n % 10
    text = DIGITS[d + 1] .. text
    n = (n - d) / 10
  until n == 0
  return text
end

-- a finite x > 0 as "1.235e+30": the mantissa to three decimals
local function scientific(x)
  local exponent = 0
  while x >= 10 do
    x = x / 10
    exponent = exponent + 1
  end
  while x < 1 do
    x = x * 10
    exponent = exponent - 1
  end
  local r = floor(x * 1000 + 0.5)
  if r >= 10000 then
    r = 1000
    exponent = exponent + 1
  end
  local fraction = digits(r % 1000)
  while #fraction < 3 do
    fraction = "0" .. fraction
  end
  local sign = "+"
  if exponent < 0 then
    sign = "-"
    exponent = -exponent
  end
  local e = digits(exponent)
  if exponent < 10 then
    e = "0" .. e
  end
  return digits(floor(r / 1000)) .. "." .. fraction .. "e" .. sign .. e
end

-- a finite number with a fixed number of decimals, rounded half up ("%.<places>f"); where that
-- many digits would not be exact (beyond 2^53), scientific
local function fixed(x, places)
  local scale = 1
  for _ = 1, places do
    scale = scale * 10
  end
  local sign = ""
  if x < 0 then
    sign = "-"
    x = -x
  end
  local r = x * scale
  if r % 1 ~= 0 then
    r = floor(r + 0.5) -- half up; a whole r stays as it is (2^53 - 1 + 0.5 would round to 2^53)
  end
  if r >= EXACT then
    return sign .. scientific(x)
  end
  if r == 0 then
    sign = ""
  end
  if places == 0 then
    return sign .. digits(r)
  end
  local fraction = r % scale
  local text = digits(fraction)
  while #text < places do
    text = "0" .. text
  end
  return sign .. digits((r - fraction) / scale) .. "." .. text
end

-- a count (step, percent, generation, version): a whole number; nil when it is not a finite number
local function count(x)
  if not finite(x) then
    return nil
  end
  return fixed(x, 0)
end

local function loss(x)
  if x ~= x then
    return "NaN"
  elseif not finite(x) then
    if x > 0 then
      return "inf"
    end
    return "-inf"
  end
  return fixed(x, 4)
end

-- a remaining time in seconds > 0, in minutes, then hours and minutes, then hours
local function duration(seconds)
  if seconds < 60 then
    return "under 1 min"
  end
  local minutes = floor(seconds / 60)
  if minutes < 60 then
    return fixed(minutes, 0) .. " min"
  end
  local hours = floor(minutes / 60)
  if hours < 100 then
    return fixed(hours, 0) .. " h " .. fixed(minutes % 60, 0) .. " min"
  end
  return fixed(hours, 0) .. " h"
end

-- a non-empty string, or nil
local function text(x)
  if type(x) == "string" and x ~= "" then
    return x
  end
  return nil
end

-- what a value is, for a message: a Lua type, or "list" for a table read from a JSON array
local function kind(x)
  if type(x) == "table" and x[1] ~= nil then
    return "list"
  end
  return type(x)
end

local function condition(status, ctype)
  if type(status.conditions) ~= "table" then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if type(c) == "table" and c.type == ctype then
      return c
    end
  end
  return nil
end

local function says(c)
  if c == nil then
    return nil
  end
  return text(c.message) or text(c.reason)
end

-- whether s begins with p, without the string library: strings compare byte by byte, and no UTF-8
-- text (all a JSON string can hold) has the byte 255, so every s that begins with p lies in
-- [p, p .. "\255")
local function begins(s, p)
  return p <= s and s < p .. "\255"
end

-- the condition's reason and message ("Reason: message"; the message alone when it already begins
-- with the reason as a word: "DiskFull at step 120: ...", "DiskFull: ..."), or whichever there is
local function explains(c)
  if c == nil then
    return nil
  end
  local r, m = text(c.reason), text(c.message)
  if r == nil or m == nil then
    return m or r
  end
  if m == r or begins(m, r .. " ") or begins(m, r .. ":") then
    return m
  end
  return r .. ": " .. m
end

local function progress(status)
  local p = status.progress
  if type(p) ~= "table" or count(p.step) == nil then
    return nil
  end
  local message = "step " .. count(p.step)
  if count(p.totalSteps) ~= nil then
    message = message .. "/" .. count(p.totalSteps)
  end
  if count(p.percent) ~= nil then
    message = message .. " (" .. count(p.percent) .. "%)"
  end
  if type(p.loss) == "number" then
    message = message .. ", loss " .. loss(p.loss)
  end
  if finite(p.etaSeconds) and p.etaSeconds > 0 then
    message = message .. ", ETA " .. duration(p.etaSeconds)
  end
  return message
end

local function registered(model)
  if type(model) ~= "table" then
    return nil
  end
  local version = text(model.version) or count(model.version)
  if text(model.name) == nil or version == nil then
    return nil
  end
  return "Registered model " .. model.name .. " version " .. version
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the kubetune operator to pick up the FineTuneJob"
  return hs
end
if kind(status) ~= "table" then
  hs.status = "Unknown"
  hs.message = "status is a " .. kind(status) .. ", not an object"
  return hs
end

local phase = status.phase
if phase == nil or phase == "" then
  hs.status = "Progressing"
  hs.message = "Waiting for the kubetune operator to pick up the FineTuneJob"
  return hs
end
if type(phase) ~= "string" then
  hs.status = "Unknown"
  hs.message = "status.phase is a " .. kind(phase) .. ", not a string"
  return hs
end

local ready = condition(status, "Ready")

if phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = registered(status.registeredModel) or says(ready) or "Succeeded"
  -- stopped at spec.budget: the job still succeeds with what it trained
  local budget = condition(status, "BudgetReached")
  if budget ~= nil and budget.status == "True" then
    hs.message = hs.message .. "; " .. (says(budget) or "BudgetReached")
  end
  -- a changed registration.alias: the model stays registered; a failed move needs a person
  local alias = condition(status, "AliasSynced")
  if alias ~= nil and alias.status == "False" and says(alias) ~= nil then
    hs.message = hs.message .. "; " .. says(alias)
    if alias.reason == "AliasFailed" then
      hs.status = "Degraded"
    end
  end
  return hs
end

if phase == "Failed" then
  hs.status = "Degraded"
  hs.message = explains(ready) or "The FineTuneJob failed"
  return hs
end

if phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = says(condition(status, "Suspended")) or "Suspended"
  return hs
end

local DEGRADED_CHILDREN = {
  ChildConflict = true,
  ChildForbidden = true,
  NoTrainingEngine = true,
  EngineNotServed = true,
  EngineNotImplemented = true,
}
local PODS_CANNOT_START = {
  Unschedulable = true,
  PodsNotCreated = true,
  ImagePullFailed = true,
  MountFailed = true,
}

-- c.reason only when it is a string (a table key of another type would be looked up as itself)
local function reason(c)
  if c ~= nil and c.status == "False" then
    return text(c.reason)
  end
  return nil
end

local children = condition(status, "ChildrenReady")
if DEGRADED_CHILDREN[reason(children) or ""] then
  hs.status = "Degraded"
  hs.message = says(children)
  return hs
end
local training = condition(status, "Training")
if (phase == "Pending" or phase == "Training") and PODS_CANNOT_START[reason(training) or ""] then
  hs.status = "Degraded"
  hs.message = says(training)
  return hs
end
local prepared = condition(status, "Prepared")
if phase == "Preparing" and PODS_CANNOT_START[reason(prepared) or ""] then
  hs.status = "Degraded"
  hs.message = says(prepared)
  return hs
end

if phase == "Pending" or phase == "Preparing" or phase == "Training" or phase == "Registering" then
  hs.status = "Progressing"
  local generation = nil
  if type(obj.metadata) == "table" then
    generation = obj.metadata.generation
  end
  if finite(generation) and finite(status.observedGeneration) and status.observedGeneration < generation then
    hs.message = "Waiting for the operator to act on generation " .. count(generation)
    return hs
  end
  if reason(children) == "ChildApiError" then
    hs.message = says(children)
  elseif phase == "Training" then
    hs.message = progress(status) or says(training) or "Training"
  elseif phase == "Registering" then
    hs.message = says(condition(status, "Registered")) or "Registering the model in MLflow"
  elseif phase == "Preparing" then
    hs.message = says(condition(status, "Prepared")) or "Preparing: downloading, checking and tokenizing"
  else
    hs.message = says(training) or says(children) or says(ready) or "Pending"
  end
  return hs
end

hs.status = "Unknown"
hs.message = "Unknown phase " .. phase
return hs
