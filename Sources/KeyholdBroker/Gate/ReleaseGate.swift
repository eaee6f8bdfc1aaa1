// The release gate's rules. Each is held by the test named after it.
//
//  1. A caller MUST be the kernel's (`Caller`): no value the client wrote takes part in a
//     decision. (ReleaseGateTests.allowedExecutablesAreCheckedAgainstTheVerifiedCaller,
//     PAMGateTests.pamItemsComeFromWhatTheBrokerVerified)
//  2. An item restricted to executables MUST be refused to any other program, and to one that
//     may have exec'd since it connected. (PAMGateTests.allowedExecutableAdmitsOnlyThatProgram,
//     PIDReuseTests.aConnectorWhosePIDTheAllowedProgramTakesIsRefused)
//  3. A lockout MUST be checked and the attempt reserved before PAM runs; a lockout record that
//     cannot be read or written MUST refuse. (ReleaseGateTests.attemptIsReservedBeforePAMSoAConcurrentOneIsBusy,
//     PAMGateLockoutTests.fortyParallelWrongGuessesReachPAMAtMostFiveTimes,
//     PAMGateLockoutTests.lockoutRecordWriteFailureLocksOut)
//  4. Without interaction allowed, PAM MUST NOT be reached and nothing is counted.
//     (ReleaseGateTests.noInteractionNeverReachesPAMOrCounts)
//  5. A reuse window MUST be scoped to the caller's session (or process), account and clock.
//     (ReleaseGateTests.reuseWithoutAVisibleSessionIsScopedToTheProcess,
//     ReleaseGateTests.reuseWindowIsNotSharedAcrossAccounts, PAMGateTests.aProgramExecedIntoDoesNotInheritAProcessWindow)
//  6. An application password MUST be right, and is never enough alone where the policy asks
//     more. (ReleaseGateTests.appPasswordRightWrongMissing, PAMGateTests.appPasswordRightWrongAndNotAloneEnough)
//  7. The gate MUST only decide: it never opens a secret (`Session.release` does, under the
//     writer). (RequestTableTests.onlyTheReleasingRowsHandOutASecretAndOnlyAfterTheirEntryIsCommitted)

import Glibc
import Synchronization
import KeyholdAuth
import KeyholdCore
import KeyholdVault
import KeyholdProtocol

/// A denial: the outcome the caller sees, and a short non-secret detail.
struct Denial: Error {
    let outcome: Outcome
    let detail: String?
    var secondsLeft: UInt64? = nil
    init(_ outcome: Outcome, _ detail: String? = nil, secondsLeft: UInt64? = nil) {
        self.outcome = outcome
        self.detail = detail
        self.secondsLeft = secondsLeft
    }

    /// An item write (a put, or the update a rotation ends in) when the vault's file system is
    /// below the free-space reserve kept for the broker's own audit writes.
    static let belowReserve = Denial(.otherError, "refused: the vault's file system is below the broker's free-space reserve")
}

/// The one place that decides whether a caller may act on an item: allowed executables,
/// biometric invalidation, lockout, reuse window, the PAM conversation itself and the
/// application password. Every release, update and removal of an item goes through
/// `authorize` (or, for an item whose own policy cannot be checked, `authorizeOwner`);
/// `state` asks `preview`. The session only carries the conversation (`Conversation`).
final class ReleaseGate: Sendable {
    /// PAM stacks the broker picks from a policy, so it knows which method succeeded.
    enum Stack: String, Sendable {
        case biometry = "keyhold-biometry"
        case passcode = "keyhold-passcode"
        case presence = "keyhold"    // fingerprint, then password
    }

    struct ReuseGrant: Sendable {
        var at: Int64
        var fingerprint: Bool
        var password: Bool
    }

    struct ReuseKey: Hashable, Sendable {
        let uid: UInt32
        let scope: ReuseScope
        /// Through the Secret Service agent: the one item and claimed requester the window was
        /// opened for (SessionSecretService.swift), so the agent cannot lend it further.
        var claim: ClaimedGrant? = nil
    }

    static let maxFailuresBeforeLockout: UInt32 = 5
    static let firstLockoutSeconds: Int64 = 60
    static let longestLockoutSeconds: Int64 = 3600

    let authenticator: PAMAuthenticator
    let fprintStateDirectory: String
    let clock: any GateClock
    /// Attempts reserved before PAM runs (AuthenticationAttempt.swift).
    let attempts = AuthenticationLedger()
    private let reuse = Mutex<[ReuseKey: ReuseGrant]>([:])

    init(authenticator: PAMAuthenticator, fprintStateDirectory: String, clock: any GateClock = SystemClock()) {
        self.authenticator = authenticator
        self.fprintStateDirectory = fprintStateDirectory
        self.clock = clock
    }

    // MARK: state without prompting

    /// The biometric domain state of a user, read from fprintd's print store.
    func domainState(user: String?) -> BiometryDomainState {
        guard let user else { return .unreadable }
        return BiometryStore.domainState(user: user, stateDirectory: fprintStateDirectory)
    }

    /// True when a `biometry-current-set` binding no longer matches the enrolled prints.
    func isInvalidated(_ item: StoredItem, state: BiometryDomainState) -> Bool {
        guard item.access.policy.bindsBiometrySet, let bound = item.biometryState else { return false }
        guard case .enrolled(_, let digest) = state else { return true }
        return !(BiometryDigest(bytes: bound).map(digest.constantTimeEquals) ?? false)
    }

    /// The constraint set still satisfiable once an invalidated biometric binding is removed;
    /// nil when the item as a whole is invalidated.
    func effectiveConstraints(_ item: StoredItem, state: BiometryDomainState) -> [Policy.Constraint]? {
        let policy = item.access.policy
        guard isInvalidated(item, state: state) else { return policy.constraints }
        if policy.combinator == .and || policy.constraints.count == 1 { return nil }
        let rest = policy.constraints.filter { $0 != .biometryCurrentSet }
        return rest.isEmpty ? nil : rest
    }

    func reuseGrant(for caller: Caller, item: StoredItem, constraints: [Policy.Constraint], now: Int64,
                    claim: ClaimedGrant? = nil) -> Bool {
        guard item.access.reuseSeconds > 0, let scope = caller.reuseScope else { return false }
        guard let grant = reuse.withLock({ $0[ReuseKey(uid: caller.uid, scope: scope, claim: claim)] }) else { return false }
        guard now - grant.at <= Int64(item.access.reuseSeconds) * 1_000_000, now >= grant.at else { return false }
        func satisfied(_ c: Policy.Constraint) -> Bool {
            switch c {
            case .biometryAny, .biometryCurrentSet: grant.fingerprint
            case .devicePasscode: grant.password
            case .userPresence: grant.fingerprint || grant.password
            }
        }
        let policy = item.access.policy
        return policy.combinator == .and ? constraints.allSatisfy(satisfied) : constraints.contains(where: satisfied)
    }

    /// Ends every reuse window of a uid (`keyhold lock`).
    func endReuse(uid: UInt32) {
        reuse.withLock { grants in grants = grants.filter { $0.key.uid != uid } }
    }

    /// Seconds of lockout left, or nil.
    static func lockoutLeft(_ record: LockoutRecord, now: Int64) -> UInt64? {
        guard record.lockedUntil > now else { return nil }
        return UInt64((record.lockedUntil - now + 999_999) / 1_000_000)
    }

    /// The record after one more failure: from the fifth consecutive failure on, each failure
    /// locks the uid out, for 1 min, then doubling, at most 1 h.
    static func afterFailure(_ record: LockoutRecord, now: Int64) -> LockoutRecord {
        var r = record
        r.failures += 1
        if r.failures >= maxFailuresBeforeLockout {
            let doublings = min(Int64(r.failures - maxFailuresBeforeLockout), 6)
            let seconds = min(firstLockoutSeconds << doublings, longestLockoutSeconds)
            r.level = UInt32(doublings + 1)
            r.lockedUntil = now + seconds * 1_000_000
        }
        return r
    }

    // MARK: the gate

    /// The whole decision for one item and one request: allowed executables, biometric
    /// invalidation, lockout (read, reserve before PAM, record), the reuse window, the PAM
    /// stacks the policy needs, and the application password (counted like any guess and
    /// checked against the item before anything is granted). `store` keeps the lockout record.
    func authorize(_ item: StoredItem, caller: Caller, request: Request, via conversation: some Conversation,
                   store: any LockoutStore) -> Result<Authorization, Denial> {
        var method: AuthMethod
        switch authorizePolicy(item, caller: caller, request: request, via: conversation, store: store) {
        case .failure(let d): return .failure(d)
        case .success(let m): method = m
        }
        guard item.access.policy.requiresAppPassword else { return .success(Authorization(method: method)) }
        switch appPassword(item, caller: caller, request: request, via: conversation, store: store) {
        case .failure(let d): return .failure(d)
        case .success(let password):
            method = method.adding(.appPassword)
            return .success(Authorization(method: method, appPassword: password))
        }
    }

    /// The uid's lockout, read without counting anything; a record that cannot be read refuses.
    func lockoutLeft(uid: UInt32, store: any LockoutStore) -> Result<UInt64?, Denial> {
        switch store.lockout(uid: uid) {
        case .success(let r): return .success(Self.lockoutLeft(r, now: clock.microseconds()))
        case .failure: return .failure(AuthenticationLedger.unrecorded)
        }
    }

    /// What `state` reports for an item: whether a `get` now would need the person. No prompt,
    /// nothing counted.
    enum Availability: String {
        case available
        case requiresAuthentication = "requires-authentication"
        case invalidated
    }

    func preview(_ item: StoredItem, caller: Caller) -> Availability {
        let biometric = item.access.policy.constraints.contains(where: \.isBiometric)
        let domain: BiometryDomainState = biometric ? domainState(user: caller.userName) : .noneEnrolled
        guard let constraints = effectiveConstraints(item, state: domain) else { return .invalidated }
        let free = constraints.isEmpty || reuseGrant(for: caller, item: item, constraints: constraints, now: clock.microseconds())
        return free && !item.access.policy.requiresAppPassword ? .available : .requiresAuthentication
    }

    /// The item's application password, asked after its policy is satisfied, counted before
    /// Argon2id checks it, and given back (as its derived key) only when it opened the item.
    /// Argon2id runs here, outside the store's lock; only the check holds the store.
    private func appPassword(_ item: StoredItem, caller: Caller, request: Request, via conversation: some Conversation,
                             store: any LockoutStore) -> Result<AppPasswordKey, Denial> {
        guard request.allowInteraction else { return .failure(Denial(.interactionNotAllowed)) }
        let password: SecureBytes
        switch conversation.ask(Prompt(style: .echoOff, purpose: .appPassword,
                                       text: "Application password for \(item.service) / \(item.account): ")) {
        case .answer(let s): password = s
        case .cancel: return .failure(Denial(.userCanceled))
        }
        defer { password.wipe() }
        let attempt: AuthenticationAttempt
        switch attempts.reserve(uid: caller.uid, store: store, now: clock.microseconds()) {
        case .failure(let d): return .failure(d)
        case .success(let a): attempt = a
        }
        let key: AppPasswordKey
        do throws(StoreError) {
            key = try AppPasswordKey.opening(item, password: password)
        } catch {
            // An empty or oversized answer is a wrong password (the reserved attempt counts it).
            return .failure(error == .tooLarge || error == .invalidItem
                ? Denial(.authenticationFailed, "wrong application password") : Denial(error.outcome))
        }
        switch store.checkAppPassword(item, key) {
        case .success:
            guard attempt.succeeded() else { key.wipe(); return .failure(AuthenticationLedger.unrecorded) }
            return .success(key)
        case .failure(let error):
            key.wipe()
            if error == .appPasswordWrong || error == .appPasswordRequired {
                return .failure(Denial(.authenticationFailed, "wrong application password"))
            }
            return .failure(Denial(error.outcome))
        }
    }

    /// Everything but the application password.
    private func authorizePolicy(_ item: StoredItem, caller: Caller, request: Request, via conversation: some Conversation,
                                 store: any LockoutStore) -> Result<AuthMethod, Denial> {
        let policy = item.access.policy
        if !item.access.allowedExecutables.isEmpty {
            // The sender, the process that connected and the executable must all agree (issue 8).
            switch caller.executableForAllowList() {
            case .failure(let problem): return .failure(Denial(.notAuthorized, problem.why))
            case .success(let exe) where !item.access.allowedExecutables.contains(exe):
                return .failure(Denial(.notAuthorized, "this program may not read the item"))
            case .success: break
            }
        }
        let state = policy.constraints.contains(where: \.acceptsFingerprint) ? domainState(user: caller.userName) : .noneEnrolled
        guard let constraints = effectiveConstraints(item, state: state) else {
            return .failure(Denial(.invalidated))
        }
        var method = AuthMethod.none
        if constraints.isEmpty && !policy.requiresAppPassword { return .success(method) }

        // An early look, so a uid already locked out is not prompted; the reservation below is
        // what actually limits guesses.
        switch lockoutLeft(uid: caller.uid, store: store) {
        case .failure(let d): return .failure(d)
        case .success(let left?): return .failure(Denial(.lockedOut, nil, secondsLeft: left))
        case .success(nil): break
        }
        let now = clock.microseconds()
        let claim = ClaimedGrant(request, item)
        if request.claimedPID != nil && claim == nil { return .failure(Denial(.notAuthorized, "the claimed requester cannot be confirmed")) }
        if !constraints.isEmpty && reuseGrant(for: caller, item: item, constraints: constraints, now: now, claim: claim) {
            method = method.adding(.reuse)
            if !policy.requiresAppPassword { return .success(method) }
        }
        // Everything from here needs the person: a finger, a password, or both.
        guard request.allowInteraction else { return .failure(Denial(.interactionNotAllowed)) }
        guard let user = caller.userName else { return .failure(Denial(.authenticationFailed, "the caller's uid has no account")) }
        let needsPAM = !method.factors.contains(.reuse) && !constraints.isEmpty
        var stacks: [Stack] = []
        var attempt: AuthenticationAttempt?
        if needsPAM {
            switch plan(constraints, combinator: policy.combinator, state: state) {
            case .success(let s): stacks = s
            case .failure(let denial): return .failure(denial)
            }
            // Counted before any guess is checked; every way out below but success keeps it counted.
            switch attempts.reserve(uid: caller.uid, store: store, now: now) {
            case .success(let a): attempt = a
            case .failure(let denial): return .failure(denial)
            }
        }
        guard conversation.announce(announcement(caller, item.service, item.account, request)) else {
            return .failure(Denial(.userCanceled))
        }

        if needsPAM, let attempt {
            for stack in stacks {
                switch runPAMWithRetries(stack, user: user, caller: caller, attempt: attempt, via: conversation) {
                case .failure(let d): return .failure(d)
                case .success(let factor): method = method.adding(factor)
                }
            }
            guard attempt.succeeded() else { return .failure(AuthenticationLedger.unrecorded) }
            grantReuse(caller, method, claim: claim)
        }
        return .success(method)
    }

    func announcement(_ caller: Caller, _ service: String, _ account: String, _ request: Request) -> Announcement {
        Announcement(executable: caller.executable, pid: caller.pid, service: service, account: account, reason: request.reason)
    }

    /// One PAM stack through the conversation; the factor it proved, or the denial. `password`
    /// (the passcode stack) notes the first hidden prompt and its answer, and gives a retried
    /// password already asked for (PasswordTries.swift).
    func runPAM(_ stack: Stack, user: String, caller: Caller, via conversation: some Conversation,
                password: PasswordTry? = nil) -> Result<AuthMethod.Factor, Denial> {
        let request = PAMRequest(service: stack.rawValue, user: user, ruser: user, tty: caller.tty, rhost: caller.remoteHost)
        let result = authenticator.authenticate(request, allowInteraction: true, interruptFD: conversation.interruptFD) { message in
            switch message {
            case .info(let text): return conversation.notify(.info, text) ? .answer(SecureBytes(count: 0)) : .cancel
            case .error(let text): return conversation.notify(.error, text) ? .answer(SecureBytes(count: 0)) : .cancel
            case .promptEchoOff(let text):
                if let password { return password.answer(text) { conversation.ask(Prompt(style: .echoOff, purpose: .authentication, text: text)) } }
                return conversation.ask(Prompt(style: .echoOff, purpose: .authentication, text: text))
            case .promptEchoOn(let text): return conversation.ask(Prompt(style: .echoOn, purpose: .authentication, text: text))
            }
        }
        password?.wrongPassword = result == .failed(code: PAMCode.authError)
        switch result {
        case .success(let answered):
            switch stack {
            case .biometry: return .success(.fingerprint)
            case .passcode: return .success(.password)
            case .presence: return .success(answered ? .password : .fingerprint)
            }
        case .failed:
            return .failure(Denial(.authenticationFailed))
        case .unavailable:
            // No reader, no prints, or a remote session: for a biometric stack this is a
            // clear failure, never a silent pass.
            return .failure(Denial(.authenticationFailed, stack == .passcode ? "authentication is unavailable" : "the fingerprint could not be checked (no reader, no scan in time, or a reader error)"))
        case .canceled:
            return .failure(Denial(.userCanceled))
        case .interactionNeeded:
            return .failure(Denial(.interactionNotAllowed))
        case .helperFailed:
            return .failure(Denial(.authenticationFailed, "authentication could not complete"))
        }
    }

    /// Opens (or widens) the caller's reuse window after PAM succeeded.
    private func grantReuse(_ caller: Caller, _ method: AuthMethod, claim: ClaimedGrant?) {
        guard let scope = caller.reuseScope else { return }
        let now = clock.microseconds()
        reuse.withLock {
            // Windows past the longest reuse time can never apply again: dropped, so the map
            // stays as small as the callers of the last few minutes.
            let oldest = now - Int64(Limits.maxReuseSeconds) * 1_000_000
            if $0.count > 64 { $0 = $0.filter { $0.value.at >= oldest } }
            let key = ReuseKey(uid: caller.uid, scope: scope, claim: claim)
            var grant = $0[key] ?? ReuseGrant(at: 0, fingerprint: false, password: false)
            if grant.at != 0 && now - grant.at > Int64(Limits.maxReuseSeconds) * 1_000_000 {
                grant = ReuseGrant(at: 0, fingerprint: false, password: false)
            }
            grant.at = now
            grant.fingerprint = grant.fingerprint || method.factors.contains(.fingerprint)
            grant.password = grant.password || method.factors.contains(.password)
            $0[key] = grant
        }
    }

    /// Which PAM stacks satisfy the constraints, in order.
    func plan(_ constraints: [Policy.Constraint], combinator: Policy.Combinator,
              state: BiometryDomainState) -> Result<[Stack], Denial> {
        let fingersEnrolled: Bool
        if case .enrolled = state { fingersEnrolled = true } else { fingersEnrolled = false }
        let biometric = constraints.contains(where: \.isBiometric)
        let passcode = constraints.contains(.devicePasscode)
        let presence = constraints.contains(.userPresence)
        let noFinger = Denial(.authenticationFailed, "no finger is enrolled for this account")

        if combinator == .and && constraints.count > 1 {
            var stacks: [Stack] = []
            if biometric {
                guard fingersEnrolled else { return .failure(noFinger) }
                stacks.append(.biometry)
            }
            if passcode { stacks.append(.passcode) }
            if presence && stacks.isEmpty { stacks.append(fingersEnrolled ? .presence : .passcode) }
            return .success(stacks)
        }
        // One constraint, or alternatives.
        if presence || (biometric && passcode) {
            return .success([fingersEnrolled ? .presence : .passcode])
        }
        if biometric {
            guard fingersEnrolled else { return .failure(noFinger) }
            return .success([.biometry])
        }
        return .success([.passcode])
    }
}
