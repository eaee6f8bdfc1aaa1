import Foundation
import KeyholdCore
import Testing
@testable import KeyholdAuth

/// Real libpam (pam_start_confdir) with the `pam/test` stacks and pam_matrix, through the real
/// keyholdd helper process. Serialized: the leak test counts this process's fds.
@Suite(.serialized) struct PAMAuthenticatorTests {
    @Test func rightPasswordSucceedsAfterAnswering() {
        let conv = RecordingConversation.password("s3cret")
        let r = PAMFixture.authenticator().authenticate(
            PAMRequest(service: "keyhold-passcode", user: "alice"), allowInteraction: true, interruptFD: nil) { conv($0) }
        #expect(r == .success(answeredPrompt: true))
        #expect(conv.messages == [.promptEchoOff("Password: ")])
    }

    @Test func wrongPasswordFailsWithAuthErr() {
        let conv = RecordingConversation.password("wrong")
        let r = PAMFixture.authenticator().authenticate(
            PAMRequest(service: "keyhold-passcode", user: "alice"), allowInteraction: true, interruptFD: nil) { conv($0) }
        #expect(r == .failed(code: 7))
    }

    @Test func unknownUserFails() {
        let conv = RecordingConversation.password("s3cret")
        let r = PAMFixture.authenticator().authenticate(
            PAMRequest(service: "keyhold-passcode", user: "mallory"), allowInteraction: true, interruptFD: nil) { conv($0) }
        #expect(r == .failed(code: 7))
    }

    @Test func cancelEndsTheTransaction() {
        let conv = RecordingConversation { _ in .cancel }
        let r = PAMFixture.authenticator().authenticate(
            PAMRequest(service: "keyhold-passcode", user: "alice"), allowInteraction: true, interruptFD: nil) { conv($0) }
        #expect(r == .canceled)
        #expect(conv.messages.count == 1)
    }

    @Test func userPresenceStackFallsBackToPassword() {
        // No fprintd for carol (no bus, or no prints): pam_fprintd is unavailable, pam_matrix asks.
        let conv = RecordingConversation.password("c4rol")
        let r = PAMFixture.authenticator().authenticate(
            PAMRequest(service: "keyhold", user: "carol"), allowInteraction: true, interruptFD: nil) { conv($0) }
        #expect(r == .success(answeredPrompt: true))
        #expect(conv.messages.last == .promptEchoOff("Password: "))
    }

    @Test func serviceWithoutFileFallsToOtherAndIsDenied() {
        let conv = RecordingConversation.password("s3cret")
        let r = PAMFixture.authenticator().authenticate(
            PAMRequest(service: "no-such-service", user: "alice"), allowInteraction: true, interruptFD: nil) { conv($0) }
        #expect(r == .failed(code: 7))
        #expect(conv.messages.isEmpty)
    }

    @Test(arguments: ["../keyhold-passcode", "/etc/passwd", "", ".hidden", "a b", String(repeating: "x", count: 200)])
    func hostileServiceNamesAreRefusedBeforeSpawning(service: String) {
        let r = PAMFixture.authenticator().authenticate(
            PAMRequest(service: service, user: "alice"), allowInteraction: true, interruptFD: nil) { _ in .cancel }
        #expect(r == .unavailable(code: 3))  // PAM_SERVICE_ERR
    }

    @Test func fieldsWithNULOrOversizedAreRefused() {
        let a = PAMFixture.authenticator()
        for req in [PAMRequest(service: "keyhold-passcode", user: "al\u{0}ice"),
                    PAMRequest(service: "keyhold-passcode", user: "alice", tty: String(repeating: "t", count: 2000)),
                    PAMRequest(service: "keyhold-passcode", user: "")] {
            #expect(a.authenticate(req, allowInteraction: true, interruptFD: nil) { _ in .cancel } == .unavailable(code: 29))
        }
    }

    @Test func oversizedAnswerIsNotSent() {
        let conv = RecordingConversation { _ in .answer(SecureBytes(count: 4096)) }
        let r = PAMFixture.authenticator().authenticate(
            PAMRequest(service: "keyhold-passcode", user: "alice"), allowInteraction: true, interruptFD: nil) { conv($0) }
        #expect(r == .canceled)
    }

    @Test func answerWithNULNeverAuthenticates() {
        // "s3cret\0x" would be "s3cret" to a C module; the helper refuses it (conversation error).
        let conv = RecordingConversation { _ in .answer(PAMFixture.secret("s3cret\u{0}x")) }
        let r = PAMFixture.authenticator().authenticate(
            PAMRequest(service: "keyhold-passcode", user: "alice"), allowInteraction: true, interruptFD: nil) { conv($0) }
        #expect(r == .unavailable(code: 9))  // pam_matrix maps conversation errors to AUTHINFO_UNAVAIL
    }
}
