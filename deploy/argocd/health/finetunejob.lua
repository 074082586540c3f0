-- Argo CD health check for kubetune.io/FineTuneJob (Lua 5.1, as Argo CD runs it).
--   Pending, Training, Registering -> Progressing
--   Succeeded                      -> Healthy
--   Failed                         -> Degraded
--   Suspended                      -> Suspended
-- The message comes from the status: the conditions' messages, training progress, the registered model.
-- A child object kubetune will not overwrite (ChildrenReady=False, ChildConflict) needs a person: Degraded.
local hs = {}

local function condition(status, ctype)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == ctype then
      return c
    end
  end
  return nil
end

local function says(c)
  if c == nil then
    return nil
  end
  if c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return c.reason
end

local function progress(status)
  local p = status.progress
  if p == nil or p.step == nil then
    return nil
  end
  local text = "step " .. tostring(p.step)
  if p.totalSteps ~= nil then
    text = text .. "/" .. tostring(p.totalSteps)
  end
  if p.percent ~= nil then
    text = text .. " (" .. tostring(p.percent) .. "%)"
  end
  if p.loss ~= nil then
    text = text .. ", loss " .. string.format("%.4f", p.loss)
  end
  if p.etaSeconds ~= nil and p.etaSeconds > 0 then
    text = text .. ", ETA " .. tostring(math.floor(p.etaSeconds / 60)) .. " min"
  end
  return text
end

local status = obj.status
if status == nil or status.phase == nil or status.phase == "" then
  hs.status = "Progressing"
  hs.message = "Waiting for the kubetune operator to pick up the FineTuneJob"
  return hs
end

local phase = status.phase
local ready = condition(status, "Ready")

if phase == "Succeeded" then
  hs.status = "Healthy"
  local model = status.registeredModel
  if model ~= nil and model.name ~= nil and model.version ~= nil then
    hs.message = "Registered model " .. model.name .. " version " .. tostring(model.version)
  else
    hs.message = says(ready) or "Succeeded"
  end
  return hs
end

if phase == "Failed" then
  hs.status = "Degraded"
  hs.message = says(ready) or "The FineTuneJob failed"
  return hs
end

if phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = says(condition(status, "Suspended")) or "Suspended"
  return hs
end

local children = condition(status, "ChildrenReady")
if children ~= nil and children.status == "False" and children.reason == "ChildConflict" then
  hs.status = "Degraded"
  hs.message = says(children)
  return hs
end

if phase == "Pending" or phase == "Training" or phase == "Registering" then
  hs.status = "Progressing"
  local generation = obj.metadata and obj.metadata.generation
  if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
    hs.message = "Waiting for the operator to act on generation " .. tostring(generation)
    return hs
  end
  if phase == "Training" then
    hs.message = progress(status) or says(condition(status, "Training")) or "Training"
  elseif phase == "Registering" then
    hs.message = says(condition(status, "Registered")) or "Registering the model in MLflow"
  else
    hs.message = says(condition(status, "Training")) or says(children) or says(ready) or "Pending"
  end
  return hs
end

hs.status = "Unknown"
hs.message = "Unknown phase " .. tostring(phase)
return hs
